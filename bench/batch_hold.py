"""The scheduler's hold after a batch (NMT_BATCH_HOLD_MS) against a GPU-like worker, without a GPU.

The real Scheduler (app/scheduler.py) with one slot, as a GPU's one worker (`--workers N`: N
slots, as N GPUs, the worker's batches independent of each other's), and a fake worker
whose batch costs what a GPU's costs the host: a fixed part (launches, syncs, read-back) and a
little more per sentence, by default 12 ms + 0.1 ms a sentence (the shipped model's batches of 32
and 64 in order on an H200 took 14.1 and 17.8 ms, BENCHMARKS.md). Loads: closed loop (each client
sends again a random turnaround after its answer, the HTTP side's time) or open loop (Poisson
arrivals). Each row: sentences/s, mean batch, and latency from submit to answer.

    .venv/bin/python bench/batch_hold.py --holds 0,10 --loads closed:16,closed:64,closed:256,open:200,open:1000,open:2000
    .venv/bin/python bench/batch_hold.py --holds 0,10 --loads closed:64 --turnaround-ms 0.5,15   # slow clients
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.scheduler import BatchKey, Scheduler  # noqa: E402
from model.options import DecodingOptions  # noqa: E402

KEY = BatchKey("model", DecodingOptions(beam_size=4))
SOURCE = [1] * 25


async def closed_loop(scheduler: Scheduler, clients: int, seconds: float, turnaround_s: tuple[float, float],
                      latencies: list[float]) -> None:
    end = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < end:
            sent = time.monotonic()
            await scheduler.submit(KEY, [SOURCE]).future
            latencies.append(time.monotonic() - sent)
            await asyncio.sleep(random.uniform(*turnaround_s))

    await asyncio.gather(*(client() for _ in range(clients)))


async def open_loop(scheduler: Scheduler, rate: float, seconds: float, latencies: list[float]) -> None:
    async def request() -> None:
        sent = time.monotonic()
        await scheduler.submit(KEY, [SOURCE]).future
        latencies.append(time.monotonic() - sent)

    requests, due, end = [], time.monotonic(), time.monotonic() + seconds
    while due < end:
        due += random.expovariate(rate)  # arrival times fixed in advance: the loop's lateness does not thin them
        if (delay := due - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        requests.append(asyncio.create_task(request()))
    await asyncio.gather(*requests)


async def one_run(args, load: str, hold_ms: float) -> str:
    kind, amount = load.split(":")
    batches: list[int] = []

    async def worker(key, sources, weights=None, deliver=None):
        await asyncio.sleep((args.base_ms + args.per_item_ms * len(sources)) / 1000)
        return [None] * len(sources)

    scheduler = Scheduler(worker, slots=args.workers, batch_tokens=32768, max_wait_s=0.005, hold_s=hold_ms / 1000,
                          on_batch=lambda key, items, tokens: batches.append(items), share_among=args.workers)
    scheduler.start()
    latencies: list[float] = []
    start = time.monotonic()
    if kind == "closed":
        low, high = (float(x) / 1000 for x in args.turnaround_ms.split(","))
        await closed_loop(scheduler, int(amount), args.seconds, (low, high), latencies)
    else:
        await open_loop(scheduler, float(amount), args.seconds, latencies)
    took = time.monotonic() - start
    await scheduler.stop(1)
    latencies.sort()

    def ms(q: float) -> str:
        return f"{latencies[int(q * (len(latencies) - 1))] * 1000:.1f}"

    what = f"{amount} clients" if kind == "closed" else f"open loop, {amount} requests/s"
    return (f"| {what} | {hold_ms:g} | {len(latencies) / took:,.0f} | {statistics.mean(batches):.1f} | {ms(0.5)} | "
            f"{ms(0.99)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--holds", default="0,5,10", help="NMT_BATCH_HOLD_MS values, alternated within each load")
    parser.add_argument("--loads", default="closed:64,open:200,open:1000,open:2000",
                        help="closed:CLIENTS or open:REQUESTS_PER_S, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--base-ms", type=float, default=12.0, help="a batch's fixed cost")
    parser.add_argument("--per-item-ms", type=float, default=0.1, help="its cost per sentence")
    parser.add_argument("--turnaround-ms", default="0.5,8", help="closed loop: a client's time from answer to "
                        "its next request, uniform between these")
    parser.add_argument("--workers", type=int, default=1, help="worker slots (a GPU each, or NMT_WORKERS on one)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    random.seed(args.seed)
    print(f"{args.workers} worker(s), a batch {args.base_ms:g} ms + {args.per_item_ms:g} ms a sentence, max_wait 5 ms, "
          f"{args.seconds:g} s a row; closed-loop turnaround {args.turnaround_ms} ms")
    print("| load | hold ms | sentences/s | mean batch | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for load in args.loads.split(","):
        for hold_ms in (float(h) for h in args.holds.split(",")):
            print(asyncio.run(one_run(args, load, hold_ms)), flush=True)


if __name__ == "__main__":
    main()
