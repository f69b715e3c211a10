"""`nmt` subcommands of the model package: translate, import-marian, import-ct2, import-argos. The
console script (nmt/cli.py) adds the offline tooling's (training/) and the service's (serve, keys)."""

from __future__ import annotations

import argparse
import sys


def read_lines(stream) -> list[str]:
    """The lines of a byte stream, decoded strictly: a line that is not UTF-8 stops the run with
    its number, before anything is translated."""
    lines = []
    for number, raw in enumerate(stream, 1):
        try:
            lines.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError as e:
            raise SystemExit(f"nmt translate: line {number} is not valid UTF-8 (byte 0x{raw[e.start]:02X} at "
                             f"offset {e.start})") from None
    return lines


def split_lines(translator, lines: list[str]) -> tuple[list[tuple[list[str], list[str]]], list[str]]:
    """Each line cut into its sentences, as /translate cuts a text (model/sentences.py): (between,
    sentences) per line, and all sentences in order. A sentence longer than the model accepts stops
    the run with its line number: nothing is truncated."""
    from model.sentences import split_sentences

    cut, sentences = [], []
    for number, line in enumerate(lines, 1):
        between, pieces = split_sentences(line)
        for piece in pieces:
            length = len(translator.encode(piece))
            if length > translator.max_source_tokens:
                raise SystemExit(f"nmt translate: line {number} has a sentence of {length} tokens (end of sentence "
                                 f"included); the model accepts at most {translator.max_source_tokens}: "
                                 f"{piece[:60]!r}...")
        cut.append((between, pieces))
        sentences += pieces
    return cut, sentences


def translate_command(args) -> None:
    import torch

    from model.sentences import interleave
    from model.translator import Translator

    translator = Translator.load(args.model, device=args.device, dtype=args.dtype, shortlist=not args.no_shortlist)
    parallel = getattr(args, "parallel", 1)
    if parallel > 1:
        torch.set_num_threads(1)  # one core per batch
    cut, sentences = split_lines(translator, read_lines(sys.stdin.buffer))
    results = iter(translator.translate(sentences, beam_size=args.beam, n_best=args.n_best,
                                        length_penalty=args.length_penalty, max_length=args.max_length,
                                        batch_tokens=args.batch_tokens, parallel=parallel))
    out = sys.stdout
    for between, pieces in cut:
        # a line without sentences (empty, or no letters) comes back as it was: output line i answers input line i
        if not pieces:
            out.write(between[0] + "\n")
            continue
        hypotheses = [next(results).hypotheses for _ in pieces]
        versions = min(len(h) for h in hypotheses)
        texts = [interleave(between, [h[k].text for h in hypotheses]) for k in range(versions)]
        if args.n_best == 1:
            out.write(texts[0] + "\n")
        else:  # hypothesis k of a line: hypothesis k of each of its sentences; its score, their mean
            scores = [sum(h[k].score for h in hypotheses) / len(hypotheses) for k in range(versions)]
            out.write("\t".join(f"{t}\t{score:.4f}" for t, score in zip(texts, scores)) + "\n")
    out.flush()


def register(subparsers) -> None:
    p = subparsers.add_parser("translate", help="translate stdin to stdout, line by line (each line cut into sentences)")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    p.add_argument("--n-best", type=int, default=1, help="hypotheses per line, tab-separated with scores")
    p.add_argument("--max-length", type=int, default=None, help="most new target tokens (EOS included), in place of "
                   "1.5 x source tokens + 10")
    p.add_argument("--length-penalty", type=float, default=None, help="score = log-prob / length^alpha (default: "
                   "the model's own, from its metadata.json; 1.0 where it has none)")
    p.add_argument("--batch-tokens", type=int, default=4096, help="source tokens per batch (beams included)")
    p.add_argument("--parallel", type=int, default=1, help="batches decoded at once, one thread each (CPU: try "
                   "the number of cores)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16", "int8"],
                   help="auto: bfloat16 on Ampere+ GPUs, int8 on CPUs with AVX-512 VNNI or AVX2 (AMX ones too), else "
                        "bfloat16 where native, else float32; int8: int8 Linear layers on the CPU (on AMX, bfloat16 "
                        "can be faster for large models in large batches: BENCHMARKS.md)")
    p.add_argument("--no-shortlist", action="store_true", help="decode over the whole vocabulary even where the "
                   "model has a vocabulary shortlist (model/shortlist.py)")
    p.set_defaults(func=translate_command)

    # the other model commands live beside the code they drive
    from model.convert import argos, ctranslate2, marian

    marian.register(subparsers)
    ctranslate2.register(subparsers)
    argos.register(subparsers)


def build_parser():
    """The parser and its subparsers, so the console script can add `serve`."""
    parser = argparse.ArgumentParser(prog="nmt", description="Transformer machine translation")
    subparsers = parser.add_subparsers(dest="command", required=True)
    register(subparsers)
    return parser, subparsers
