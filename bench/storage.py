"""What a put into the in-process store costs (app/storage.py MemoryStorage), as the translation
cache fills its byte budget and then evicts: each put timed alone, on an event loop as the server
calls it. A put that holds the loop for milliseconds holds every request in flight with it.

    .venv/bin/python bench/storage.py [--tree DIR] [--budget-mib 64] [--value-bytes 250] [--after 100000]

Rows: the puts that fill the budget (a sentence's cached hypotheses without attention weights are
~250 bytes, here 125-375 at random as sentences vary: a 64 MiB cache holds ~270,000), then
`--after` puts more, each evicting the least recently used. `--tree` imports app/ from another
checkout (a worktree of an older commit), to compare side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path


def row(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return (f"| {name} | {len(seconds):,} | {sum(seconds) / len(seconds) * 1e6:.1f} | {at(0.5) * 1e6:.1f} | "
            f"{at(0.999) * 1e6:.0f} | {ordered[-1] * 1e3:.1f} | {sum(s > 1e-3 for s in seconds):,} |")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the checkout whose app/storage.py is measured")
    p.add_argument("--budget-mib", type=float, default=64, help="the kind's byte budget (NMT_CACHE_BYTES: 64 MiB)")
    p.add_argument("--value-bytes", type=int, default=250, help="mean bytes of a stored value (each one half to "
                   "one and a half times that)")
    p.add_argument("--after", type=int, default=100_000, help="puts timed once the budget is full")
    args = p.parse_args()
    sys.path.insert(0, str(args.tree))
    from app.storage import MemoryStorage

    budget = int(args.budget_mib * 2**20)
    storage, rng = MemoryStorage({"cache": budget}), random.Random(0)
    values = [b"x" * rng.randint(args.value_bytes // 2, args.value_bytes * 3 // 2) for _ in range(1000)]
    filling = budget // args.value_bytes
    seconds = []
    for i in range(filling + args.after):
        value = values[i % len(values)]
        start = time.perf_counter()
        await storage.put(f"cache:{i:064x}", value, 86400.0)  # a sha256 hex key, NMT_CACHE_TTL_S
        seconds.append(time.perf_counter() - start)
    print(f"{args.tree}: puts of {args.value_bytes // 2}-{args.value_bytes * 3 // 2}-byte values into a "
          f"{args.budget_mib:g} MiB kind "
          f"({storage.count('cache'):,} entries when full)")
    print("| puts | count | mean us | p50 us | p99.9 us | max ms | over 1 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(row("filling the budget", seconds[:filling]))
    print(row("full: each evicts the least recently used", seconds[filling:]))


if __name__ == "__main__":
    asyncio.run(main())
