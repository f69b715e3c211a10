"""An int8 model's fused engine against another build of the CPU kernels, side by side in one
process: whole batches decoded (beam 4) and the encoder's share of them, on the batches a service
makes (sentences as they come) or an offline call makes (sorted by length).

    .venv/bin/python bench/encoder.py --other nmt_cpu_kernels_avx2_42276be4ccb6 --data prose@c7b0ed3 \
        [--batch 20] [--batches 20] [--sorted] [--other-groups]
    .venv/bin/python bench/encoder.py --other ... --agreement --data prose+code@2163a0c

--other: the module name of a build in the kernels' cache (TORCH_EXTENSIONS_DIR, else
~/.cache/torch_extensions), e.g. one that a checkout of an older commit built with
`.venv/bin/python -c "from model import kernels; kernels.load()"`. --other-groups: the search
cuts the other engine's batches into length groups before encoding (`search.encode_by_length`),
as it did for every fused engine before the fused encoder skipped padding itself. The two
engines take turns batch by batch, so the machine's drift hits both alike; the translations
they give are compared (int8 products are exact, but float32 attention rounds differently, and
a last bit now and then moves an activation to another int8 level and a near-tied beam with it).
--agreement: instead, each engine translates all the sentences (`Translator.translate`, beam 4),
and so does the float32 model without int8 layers; prints how many of each engine's translations
are the float32 model's, and their chrF against those (which engine is nearer the model it
quantizes).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sentences import load_sentences, sentences_used  # noqa: E402

from model import kernels  # noqa: E402
from model.cpu.fused import fuse  # noqa: E402
from model.options import DecodingOptions  # noqa: E402
from model.translator import Translator  # noqa: E402


def other_engine(translator: Translator, name: str, groups: bool):
    """The translator's model fused with the kernels build `name` from the cache."""
    library = kernels.build_directory(name) / f"{name}.so"
    if not library.is_file():
        raise SystemExit(f"no build {library}: build it in a checkout of that code first")
    saved = kernels._module
    kernels._module = kernels._import(name, library)
    try:
        engine = fuse(translator.model)
    finally:
        kernels._module = saved
    engine.skips_padding = not groups
    return engine


def agreement(translator: Translator, engines: dict, texts: list[str], model: str) -> None:
    """How near each engine's translations are to the float32 model's (see the docstring)."""
    import sacrebleu

    def best(t: Translator) -> list[str]:
        return [r.hypotheses[0].text for r in t.translate(texts, beam_size=4)]

    reference = best(Translator.load(model, device="cpu", dtype="float32"))
    print(f"{len(texts)} sentences, beam 4, against the float32 model's translations")
    print("| engine | the float32 model's translation | chrF against them |")
    print("|---|---:|---:|")
    for key, engine in engines.items():
        translator.decoder = engine
        found = best(translator)
        same = sum(a == b for a, b in zip(found, reference))
        print(f"| {key} | {same}/{len(texts)} | {sacrebleu.corpus_chrf(found, [reference]).score:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="checkpoints/en-de")
    parser.add_argument("--other", required=True, help="module name of another kernels build in the cache")
    parser.add_argument("--other-groups", action="store_true", help="encode the other's batches in length groups")
    parser.add_argument("--data", default="prose@c7b0ed3")
    parser.add_argument("--batch", type=int, default=20, help="sentences a batch")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--sorted", action="store_true", help="batches of length-sorted sentences (offline)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--agreement", action="store_true", help="agreement with the float32 model instead of speed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    translator = Translator.load(args.model, device="cpu", dtype="int8")
    if not translator.fused:
        raise SystemExit("the model did not fuse (no kernels, or not int8)")
    engines = {"this tree": translator.decoder, args.other: other_engine(translator, args.other, args.other_groups)}
    texts = load_sentences(args.data, 100_000)
    print(sentences_used(args.data, texts))
    if args.agreement:
        agreement(translator, engines, texts, args.model)
        return
    ids = [translator.encode(t) for t in texts]
    if args.sorted:
        ids.sort(key=len)
        step = max(1, (len(ids) - args.batch) // args.batches)
        batches = [ids[i:i + args.batch] for i in range(0, len(ids) - args.batch + 1, step)][:args.batches]
    else:
        rng = random.Random(0)
        batches = [rng.sample(ids, min(args.batch, len(ids))) for _ in range(args.batches)]
    padding = sum(len(b) * max(map(len, b)) for b in batches) / sum(sum(map(len, b)) for b in batches)

    spent = {key: [0.0, 0.0] for key in engines}  # whole decode, encoder
    outputs: dict[str, list] = {key: [] for key in engines}
    for key, engine in engines.items():
        encode = engine.encode

        def timed(src, encode=encode, key=key):
            start = time.perf_counter()
            out = encode(src)
            spent[key][1] += time.perf_counter() - start
            return out

        engine.encode = timed
    options = DecodingOptions(beam_size=4)
    with torch.inference_mode():
        for engine in engines.values():  # warm-up
            translator.decoder = engine
            translator.decode(batches[0], options)
        spent = {key: [0.0, 0.0] for key in engines}
        for i, batch in enumerate(batches):
            for key in (list(engines) if i % 2 else list(engines)[::-1]):
                translator.decoder = engines[key]
                start = time.perf_counter()
                outputs[key].append([h[0].token_ids for h in translator.decode(batch, options)])
                spent[key][0] += time.perf_counter() - start
    n, sentences = len(batches), sum(map(len, batches))
    same = sum(a == b for x, y in zip(*outputs.values()) for a, b in zip(x, y))
    print(f"{n} batches of {args.batch} ({'sorted' if args.sorted else 'as they come'}), padded source tokens "
          f"{padding:.2f}x the sentences' own, {args.threads} thread(s); the same translation {same}/{sentences}")
    print("| engine | sentences/s | ms a batch | encoder ms a batch |")
    print("|---|---:|---:|---:|")
    for key, (whole, encoder) in spent.items():
        label = key + (" (length groups)" if key != "this tree" and args.other_groups else "")
        print(f"| {label} | {sentences / whole:.1f} | {whole / n * 1000:.1f} | {encoder / n * 1000:.1f} |")
    first, second = (spent[key][0] for key in engines)
    print(f"this tree / other: {second / first:.3f}x the sentences/s")


if __name__ == "__main__":
    main()
