"""`nmt` subcommands of the model package: translate, import-marian. The console script
(app/cli.py) adds the offline tooling's (training/) and `serve`."""

from __future__ import annotations

import argparse
import sys


def translate_command(args) -> None:
    import torch

    from model.translator import Translator

    translator = Translator.load(args.model, device=args.device, dtype=args.dtype)
    parallel = getattr(args, "parallel", 1)
    if parallel > 1:
        torch.set_num_threads(1)  # one core per batch
    lines = [line.rstrip("\n") for line in sys.stdin]
    # empty lines stay empty lines, so output line i always answers input line i
    texts = [line for line in lines if line.strip()]
    results = iter(translator.translate(texts, beam_size=args.beam, n_best=args.n_best,
                                        length_penalty=args.length_penalty, max_decoding_length=args.max_length,
                                        batch_tokens=args.batch_tokens, parallel=parallel))
    out = sys.stdout
    for line in lines:
        if not line.strip():
            out.write("\n")
            continue
        hyps = next(results).hypotheses
        if args.n_best == 1:
            out.write(hyps[0].text + "\n")
        else:
            out.write("\t".join(f"{h.text}\t{h.score:.4f}" for h in hyps) + "\n")
    out.flush()


def register(subparsers) -> None:
    p = subparsers.add_parser("translate", help="translate stdin, one sentence per line, to stdout")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    p.add_argument("--n-best", type=int, default=1, help="hypotheses per line, tab-separated with scores")
    p.add_argument("--max-length", type=int, default=None, help="most new target tokens (EOS included), in place of "
                   "1.5 x source tokens + 10")
    p.add_argument("--length-penalty", type=float, default=1.0, help="score = log-prob / length^alpha")
    p.add_argument("--batch-tokens", type=int, default=4096, help="source tokens per batch (beams included)")
    p.add_argument("--parallel", type=int, default=1, help="batches decoded at once, one thread each (CPU: try "
                   "the number of cores)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16", "int8"],
                   help="auto: bfloat16 on Ampere+ GPUs and AMX CPUs, int8 on CPUs with AVX-512 VNNI or AVX2, else bfloat16 "
                        "where native, else float32; int8: int8 Linear layers on the CPU")
    p.set_defaults(func=translate_command)

    # the other model commands live beside the code they drive
    from model.convert import marian

    marian.register(subparsers)


def build_parser():
    """The parser and its subparsers, so the console script can add `serve`."""
    parser = argparse.ArgumentParser(prog="nmt", description="Transformer machine translation")
    subparsers = parser.add_subparsers(dest="command", required=True)
    register(subparsers)
    return parser, subparsers
