"""Running batches without the service: does a worker's running batch decode as fast as the
Translator decodes the same sentences batch by batch, and where does its time go?

    python bench/running.py --model checkpoints/en-de --device cuda [--in-flight 64] [--sentences 3000]
                            [--profile OUT.txt]

RunningBatches (model/running.py) is fed closed-loop, as a worker is by `--in-flight` clients
sending one sentence each: that many sentences are in it at any time, a finished one replaced by
the next at the following step. Each part of its loop is timed (wall time, inclusive; on a GPU a
step's wait for the device falls in `step`, at its one host sync): admitting sentences (encoder,
joining their slots), the step (beams reorder inside it), reading finished hypotheses back. Then
Translator.translate decodes the same sentences in one call (length-sorted token-budget batches,
the service's budget), and the table gives both in sentences/s; `--join` compares ways of
letting sentences join in groups (RunningBatches' join_group and join_wait), `--steps engine,model`
the Translator's decoder step (on an int8 CPU model the fused one) against the model's own; `--batch-sizes`
adds the Translator over the same sentences cut into batches of each size, in order (what a
worker decoding batch by batch gets from N clients: a service at 64 clients cannot beat its engine
at batches of 64 or less). `--profile` writes
torch's profile of 50 running steps (the host's ops outside the graph are what a CUDA graph does
not hide).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.settings import Settings  # noqa: E402
from bench.sentences import FALLBACK, load_sentences, sentences_used  # noqa: E402
from model import graphs, running  # noqa: E402
from model.options import DecodingOptions  # noqa: E402
from model.translator import Translator  # noqa: E402

# what is timed: (owner, method)
TIMED = [(running.RunningBatch, "admit"), (running.RunningBatch, "step"), (running.RunningBatch, "read_back"),
         (running.EagerRunningBatch, "admit"), (running.EagerRunningBatch, "step"),
         (running.EagerRunningBatch, "read_back"), (graphs.SearchBuffers, "run")]


def timed(seconds: dict[str, list[float]]) -> None:
    """Wrap TIMED's methods so that each call's wall time goes to seconds[name]."""
    for owner, name in TIMED:
        method = getattr(owner, name)

        def wrapper(*args, _method=method, _name=f"{owner.__name__}.{name}", **kwargs):
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                seconds[_name].append(time.perf_counter() - start)

        setattr(owner, name, functools.wraps(method)(wrapper))


def run_closed_loop(batches: running.RunningBatches, ids: list[list[int]], options: DecodingOptions,
                    in_flight: int) -> tuple[float, int, float]:
    """Every sentence of `ids` through `batches`, `in_flight` at a time: (seconds, steps, mean
    sentences running per step)."""
    following = iter(range(len(ids)))
    for i in range(min(in_flight, len(ids))):
        batches.add(next(following), ids[i], options)
    steps, running_sum = 0, 0
    start = time.perf_counter()
    while batches.busy:
        finished = batches.step()
        steps += 1
        running_sum += len(batches.sentences)
        for _tag, result in finished:
            if isinstance(result, Exception):
                raise result
            following_index = next(following, None)
            if following_index is not None:
                batches.add(following_index, ids[following_index], options)
    return time.perf_counter() - start, steps, running_sum / max(steps, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="checkpoints/en-de")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is one)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--data", help="one sentence per line, or prose@REV (bench/sentences.py; default: its built-in sentences)")
    p.add_argument("--sentences", type=int, default=3000, help="sentences decoded by each")
    p.add_argument("--in-flight", type=int, default=64, help="sentences in the running batch at any time")
    p.add_argument("--slots", type=int, default=64, help="NMT_RUNNING_SLOTS")
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--kind", choices=["auto", "fixed", "eager"], default="auto",
                   help="the running batch: fixed-shape (RunningBatch, the GPU's) or eager (EagerRunningBatch, "
                        "the CPU's); auto: as the worker picks")
    p.add_argument("--join", nargs="+", default=["1:0"], metavar="GROUP:WAIT",
                   help="RunningBatches' join_group:join_wait, one or more: each runs twice, alternating; the "
                        "parts of the loop are those of the first's first run")
    p.add_argument("--steps", default="engine", help="comma-separated, each run in turn: engine (the Translator's "
                   "decoder step: on an int8 CPU the fused one) or model (the model's own PyTorch step)")
    p.add_argument("--batch-sizes", default="", help="comma-separated: the Translator also decodes the same "
                   "sentences in consecutive batches of each size (Translator.decode per batch)")
    p.add_argument("--profile", help="write torch's profile of 50 running steps here")
    args = p.parse_args()

    translator = Translator.load(args.model, device=args.device, dtype=args.dtype)
    lines = load_sentences(args.data, args.sentences) if args.data else FALLBACK
    texts = [lines[i % len(lines)] for i in range(args.sentences)]
    ids = [translator.encode(t) for t in texts]
    options = DecodingOptions(beam_size=args.beam_size)
    seconds: dict[str, list[float]] = defaultdict(list)
    fixed_shape = {"auto": None, "fixed": True, "eager": False}[args.kind]

    engine_step = translator.decoder

    def new_batches(join: str = "1:0", step: str = "engine") -> running.RunningBatches:
        group, wait = (int(x) for x in join.split(":"))
        translator.decoder = engine_step if step == "engine" else translator.model
        return running.RunningBatches(translator, args.slots, fixed_shape, join_group=group, join_wait=wait)

    def synchronize() -> None:
        if translator.device.type == "cuda":
            torch.cuda.synchronize()

    # warm-up: graphs captured, kernels loaded
    run_closed_loop(new_batches(), ids[: 2 * args.in_flight], options, args.in_flight)
    translator.translate(texts[:64], beam_size=args.beam_size)
    synchronize()

    timed(seconds)
    steps_kinds = args.steps.split(",")
    # "join, step" -> (seconds, steps, running)
    runs: dict[tuple[str, str], list[tuple[float, int, float]]] = defaultdict(list)
    parts: dict[str, list[float]] = {}
    for _ in range(2):
        for join in args.join:
            for step in steps_kinds:
                seconds.clear()
                runs[join, step].append(run_closed_loop(new_batches(join, step), ids, options, args.in_flight))
                synchronize()
                parts = parts or dict(seconds)
    translator.decoder = engine_step
    elapsed, steps, _ = runs[args.join[0], steps_kinds[0]][0]
    budget = Settings().batch_token_budget(translator.device.type)  # the service's default
    start = time.perf_counter()
    translator.translate(texts, beam_size=args.beam_size, batch_tokens=budget)
    synchronize()
    offline = time.perf_counter() - start

    fixed_batches = {}  # size -> seconds: the Translator, batch by batch, batches of that size
    for size in (int(x) for x in args.batch_sizes.split(",") if x):
        translator.decode(ids[:size], options)  # its buffers (and graphs) made before the clock starts
        synchronize()
        start = time.perf_counter()
        for i in range(0, len(ids), size):
            translator.decode(ids[i:i + size], options)
        synchronize()
        fixed_batches[size] = time.perf_counter() - start

    kind = "fixed-shape" if new_batches().fixed_shape else "eager"
    print(f"sentences: {sentences_used(args.data, lines)}")
    print(f"{translator.device} {translator.dtype}, {kind} running batch, beam {args.beam_size}, {len(ids)} sentences, "
          f"{args.in_flight} in flight, {args.slots} slots; torch threads {torch.get_num_threads()}\n")
    print("| decoding | sentences/s (each run) | steps | ms per step | sentences running per step | / offline |")
    print("|---|---:|---:|---:|---:|---:|")
    for (join, step), measured in runs.items():
        rates = [len(ids) / s for s, _, _ in measured]
        s, n, mean = measured[0]
        which = f", {step} step" if len(steps_kinds) > 1 else ""  # (the default's rows read as they always did)
        print(f"| running batch, closed loop, join {join}{which} | {', '.join(f'{r:,.1f}' for r in rates)} | {n} | "
              f"{1000 * s / n:.3f} | {mean:.1f} | {offline / statistics.median(s for s, _, _ in measured):.2f}x |")
    print(f"| Translator.translate, one call | {len(ids) / offline:,.1f} | | | | |")
    for size, taken in fixed_batches.items():
        print(f"| Translator, batches of {size} sentences in order | {len(ids) / taken:,.1f} | | | | "
              f"{offline / taken:.2f}x |")
    print(f"\n| part of the loop, join {args.join[0]}, {steps_kinds[0]} step (wall, inclusive) | calls | ms per call | "
          "ms per step | share of the loop |")
    print("|---|---:|---:|---:|---:|")
    for name, values in sorted(parts.items(), key=lambda item: -sum(item[1])):
        total = sum(values)
        print(f"| {name} | {len(values)} | {1000 * total / len(values):.3f} | {1000 * total / steps:.3f} | "
              f"{total / elapsed:.0%} |")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if translator.device.type == "cuda" else [])
        batches = new_batches(args.join[0])
        for i in range(args.in_flight):
            batches.add(i, ids[i], options)
        for _ in range(5):
            batches.step()
        with profile(activities=activities) as prof:
            for _ in range(50):
                for tag, _result in batches.step():
                    batches.add(tag, ids[tag], options)  # the same sentence again: the batch stays full
            synchronize()
        Path(args.profile).write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        print(f"\nprofile of 50 steps: {args.profile}")


if __name__ == "__main__":
    main()
