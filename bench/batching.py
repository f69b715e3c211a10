"""Does a sentence's translation depend on what it is batched with?

    python bench/batching.py --model checkpoints/en-de --data data/corpus/dev.en --limit 200

The service batches concurrent requests together, so an engine whose output for one sentence
changes with the other sentences in its batch gives answers that vary with traffic. For each
engine and compute type this translates the first --limit sentences (beam 4) all in one call and
then one at a time, and counts the sentences whose best translation differs. Ours runs through
`Translator`; CTranslate2 (if installed) gets the same weights via `bench/engine.py`'s converter.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from model.translator import Translator  # noqa: E402


def ours(model: str, dtype: str, lines: list[str], beam: int) -> tuple[list[str], list[str]]:
    from bench.engine import our_translator

    translator = our_translator(Path(model), dtype)
    together = [r.hypotheses[0].text for r in translator.translate(lines, beam_size=beam)]
    alone = [translator.translate([line], beam_size=beam)[0].hypotheses[0].text for line in lines]
    return together, alone


def ctranslate2_outputs(model: str, compute: str, lines: list[str], beam: int, workdir: Path):
    import ctranslate2

    from bench.engine import converted_for_ct2

    converted = converted_for_ct2(Path(model), workdir)
    tokenizer = Translator.load(model, device="cpu", dtype="float32")
    sources = [tokenizer.tokenizer.source_pieces(tokenizer.encode(line)) for line in lines]
    engine = ctranslate2.Translator(str(converted), device="cpu", compute_type=compute)
    together = [r.hypotheses[0] for r in engine.translate_batch(sources, beam_size=beam, max_batch_size=len(sources))]
    alone = [engine.translate_batch([s], beam_size=beam)[0].hypotheses[0] for s in sources]
    return together, alone


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="checkpoints/en-de")
    p.add_argument("--data", default="data/corpus/dev.en", help="one sentence per line")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--ours", default="float32,int8,int8-per-batch",
                   help="our dtypes (bfloat16 too on a CPU with native bf16; int8-per-batch: bench/engine.py)")
    p.add_argument("--ct2", default="float32,int8", help="CTranslate2 compute types; empty to skip")
    p.add_argument("--workdir", default=str(ROOT / "artifacts" / "bench"))
    args = p.parse_args()
    lines = [line.strip() for line in Path(args.data).read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = lines[: args.limit]
    torch.set_num_threads(1)

    runs = [("ours", d, lambda d=d: ours(args.model, d, lines, args.beam_size)) for d in args.ours.split(",") if d]
    try:
        import ctranslate2  # noqa: F401

        runs += [("ctranslate2", c, lambda c=c: ctranslate2_outputs(args.model, c, lines, args.beam_size,
                                                                    Path(args.workdir)))
                 for c in args.ct2.split(",") if c]
    except ImportError:
        print("ctranslate2 not installed: ours only (pip install -e '.[bench]')")
    print(f"{len(lines)} sentences of {args.data}, beam {args.beam_size}: all in one call, then one at a time\n")
    print("| engine | compute | best translation differs alone vs batched |")
    print("|---|---|---:|")
    for engine, compute, run in runs:
        together, alone = run()
        differ = sum(a != b for a, b in zip(together, alone))
        print(f"| {engine} | {compute} | {differ} / {len(lines)} |", flush=True)


if __name__ == "__main__":
    main()
