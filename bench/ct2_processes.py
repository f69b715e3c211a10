"""CTranslate2 int8 in one thread, with inter_threads=2, and in two processes of one thread each.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/ct2_processes.py --model checkpoints/en-de

A check on why ours gains less than CTranslate2 from a second core (BENCHMARKS.md, session 4):
if two processes (each with its own copy of the weights, as our worker processes have) gained
much less than CTranslate2's threads sharing one copy, the duplicated weights would be the cause.
The work is bench/engine.py's: random 25-token sources, exactly 30 target tokens, beam 4; the
two processes get half the batch each and start together; seconds per batch, mean of --repeat.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.engine import converted_for_ct2, make_sources, pieces  # noqa: E402
from model.checkpoint import load_checkpoint  # noqa: E402


def decode(translator, batch, args, pad, **options) -> float:
    """Mean seconds to decode `batch`, after one warm-up."""
    def once():
        translator.translate_batch(batch, beam_size=args.beam_size, max_decoding_length=args.tgt_len,
                                   min_decoding_length=args.tgt_len, suppress_sequences=[[pad]], **options)
    once()
    start = time.perf_counter()
    for _ in range(args.repeat):
        once()
    return (time.perf_counter() - start) / args.repeat


def one_process(model_dir, batch, args, pad, start_together, results) -> None:
    import ctranslate2

    translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type="int8", intra_threads=1)
    translator.translate_batch(batch[:1], beam_size=1, max_decoding_length=2)  # loaded and warm before the barrier
    start_together.wait()
    results.put(decode(translator, batch, args, pad))


def main() -> None:
    import ctranslate2

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="checkpoints/en-de")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--src-len", type=int, default=25)
    p.add_argument("--tgt-len", type=int, default=30)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--workdir", default=str(ROOT / "artifacts" / "bench"))
    args = p.parse_args()

    model_dir = converted_for_ct2(Path(args.model), Path(args.workdir))
    _, tokenizer, _ = load_checkpoint(Path(args.model))
    c = tokenizer.config
    tokens = pieces(c.src_vocab_size, tokenizer.source_pieces_by_id, tokenizer.source_sp)
    special = {c.pad_id, c.eos_id, c.unk_id, c.bos_id, c.decoder_start_id}  # as bench/engine.py draws them
    batch = [[tokens[i] for i in s] for s in make_sources(args.batch, args.src_len, c.src_vocab_size, special, c.eos_id)]
    pad = tokens[c.pad_id]

    one = decode(ctranslate2.Translator(str(model_dir), device="cpu", compute_type="int8", intra_threads=1),
                 batch, args, pad)
    inter = decode(ctranslate2.Translator(str(model_dir), device="cpu", compute_type="int8", intra_threads=1,
                                          inter_threads=2), batch, args, pad, max_batch_size=-(-len(batch) // 2))
    spawn = multiprocessing.get_context("spawn")
    start_together, results = spawn.Barrier(3), spawn.Queue()
    half = -(-len(batch) // 2)
    processes = [spawn.Process(target=one_process, args=(model_dir, part, args, pad, start_together, results))
                 for part in (batch[:half], batch[half:])]
    for process in processes:
        process.start()
    start_together.wait()
    two = max(results.get(), results.get())
    for process in processes:
        process.join()
    print(f"CTranslate2 int8, {args.model}, beam {args.beam_size} x {args.batch}, seconds per batch:")
    print("| layout | s | gain over 1 thread |\n|---|---:|---:|")
    for name, seconds in [("1 thread", one), ("inter_threads 2", inter), ("2 processes x 1 thread", two)]:
        print(f"| {name} | {seconds:.3f} | {one / seconds:.2f}x |")


if __name__ == "__main__":
    main()
