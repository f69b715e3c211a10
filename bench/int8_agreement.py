"""How many translations int8 changes: each engine's int8 against its own float32 on the same
weights, same sentences, beam 4. Ours on every int8 product path this CPU runs
(model/kernels/int8.cpp: AVX-512 VNNI, AVX2, portable; `NMT_INT8_PATH`), CTranslate2 on our
checkpoint exported to its format (its int8 is what it runs on this CPU).

    .venv/bin/python bench/int8_agreement.py --model checkpoints/en-de [--data FILE | --prose-commit REV] [--limit 500]

Sentences: --data (one a line; default data/corpus/test_sw.en), else the English prose of this
repository's Markdown files (README.md, docs/, BENCHMARKS.md, SECURITY.md: sentences of 5-30 words
without code), which any checkout has; they change with the docs, so --prose-commit REV reads them
as REV had them. A changed translation is not a worse one; the count says
how far int8 moves the model from its float32 self, which quantization error alone decides.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.engine import converted_for_ct2  # noqa: E402
from bench.sentences import prose_sentences  # noqa: E402
from model import kernels  # noqa: E402
from model.checkpoint import load_checkpoint  # noqa: E402


def ours(model: Path, sentences_file: Path, dtype: str, path: str | None) -> list[str]:
    """`nmt translate` (beam 4) in its own process: the int8 path is chosen once per process."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    if path:
        env["NMT_INT8_PATH"] = path
    with sentences_file.open() as lines:
        out = subprocess.run([sys.executable, "-m", "nmt", "translate", "--model", str(model), "--dtype", dtype,
                              "--beam", "4"], stdin=lines, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return out.stdout.splitlines()


def theirs(model: Path, sentences: list[str], compute: str, workdir: Path) -> list[list[str]]:
    """CTranslate2 on our checkpoint in its format, beam 4, as token strings."""
    import ctranslate2

    _, tokenizer, _ = load_checkpoint(model)
    translator = ctranslate2.Translator(str(converted_for_ct2(model, workdir)), device="cpu", compute_type=compute)
    sources = [tokenizer.source_pieces(tokenizer.encode_source(s)) for s in sentences]
    results = translator.translate_batch(sources, beam_size=4, max_batch_size=32, length_penalty=1.0)
    return [r.hypotheses[0] for r in results]


def changed(a: list, b: list) -> int:
    assert len(a) == len(b), (len(a), len(b))
    return sum(x != y for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "en-de")
    ap.add_argument("--data", default="data/corpus/test_sw.en")
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--prose-commit", help="without --data: the Markdown prose as this commit had it")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "nmt-bench")
    ap.add_argument("--no-ct2", action="store_true")
    args = ap.parse_args()
    if Path(args.data).is_file():
        sentences = [line.strip() for line in Path(args.data).read_text(encoding="utf-8").splitlines() if line.strip()]
        origin = args.data
    else:
        sentences = prose_sentences(args.prose_commit)
        origin = f"the prose of this repository's Markdown files (at {args.prose_commit or 'the working tree'})"
    sentences = sentences[: args.limit]
    module = kernels.load()
    paths = module.int8_paths() if module is not None else []
    print(f"sentences: {origin}: {len(sentences)}; int8 paths on this CPU: {', '.join(paths) or 'none (no kernels)'}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as handle:
        handle.write("\n".join(sentences) + "\n")
        handle.flush()
        source = Path(handle.name)
        reference = ours(args.model, source, "float32", None)
        rows = [(f"ours int8, {path} (activations in {module.int8_levels(path) + 1} levels)",
                 changed(ours(args.model, source, "int8", path), reference)) for path in paths]
    if not args.no_ct2:
        import ctranslate2

        reference = theirs(args.model, sentences, "float32", args.workdir)
        rows.append((f"CTranslate2 {ctranslate2.__version__} int8", changed(theirs(args.model, sentences, "int8", args.workdir),
                                                                       reference)))
    print("| engine | translations int8 changes from the same engine's float32 | share |\n|---|---:|---:|")
    for name, count in rows:
        print(f"| {name} | {count} of {len(sentences)} | {count / len(sentences):.0%} |")


if __name__ == "__main__":
    main()
