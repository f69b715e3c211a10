"""What the server's calls into its stores cost as the stored state grows: a call whose cost
follows everything stored, not its own request, is a slow leak of capacity and, on the event loop,
a stall of every request in flight.

    .venv/bin/python bench/storage.py [--tree DIR] [--budget-mib 64] [--value-bytes 250] [--after 100000] \
        [--keys 100000] [--glossary-owners 20]

First table, the in-process store (app/storage.py MemoryStorage) as the translation cache fills its
byte budget and then evicts, each put timed alone on an event loop as the server calls it: the
puts that fill the budget (a sentence's cached hypotheses without attention weights are ~250
bytes, here 125-375 at random as sentences vary: a 64 MiB cache holds ~270,000), then `--after`
puts more, each evicting the least recently used.

Second table, what one call reads beside others' state: whether any API key is stored (asked on
every DeepL call) with `--keys` keys in the SQLite key store; and one key's glossaries listed
(also on every glossary created, for its quota) with `--glossary-owners` other keys' 5 MB
glossaries in a redis-server started here (skipped without one).

`--tree` imports app/ from another checkout (a worktree of an older commit), to compare side by
side.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path


def row(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return (f"| {name} | {len(seconds):,} | {sum(seconds) / len(seconds) * 1e6:.1f} | {at(0.5) * 1e6:.1f} | "
            f"{at(0.999) * 1e6:.0f} | {ordered[-1] * 1e3:.1f} | {sum(s > 1e-3 for s in seconds):,} |")


async def memory_puts(args) -> None:
    from app.storage import MemoryStorage

    budget = int(args.budget_mib * 2**20)
    resident = resident_mib()
    storage, rng = MemoryStorage({"cache": budget}), random.Random(0)
    sizes = [rng.randint(args.value_bytes // 2, args.value_bytes * 3 // 2) for _ in range(1000)]
    filling = budget // args.value_bytes
    seconds = []
    for i in range(filling + args.after):
        value = str(i).encode().ljust(sizes[i % len(sizes)], b"x")  # an object of its own, as a server's are
        start = time.perf_counter()
        await storage.put(f"cache:{i:064x}", value, 86400.0)  # a sha256 hex key, NMT_CACHE_TTL_S
        seconds.append(time.perf_counter() - start)
    gc.collect()
    print(f"{args.tree}: puts of {args.value_bytes // 2}-{args.value_bytes * 3 // 2}-byte values into a "
          f"{args.budget_mib:g} MiB kind ({storage.count('cache'):,} entries when full; the process's resident "
          f"memory grew {resident_mib() - resident:.0f} MiB)")
    print("| puts | count | mean us | p50 us | p99.9 us | max ms | over 1 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(row("filling the budget", seconds[:filling]))
    print(row("full: each evicts the least recently used", seconds[filling:]))


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def timed(call, repeat: int) -> tuple[float, float]:
    """Mean seconds of call(), and the most memory one call held at once (MiB of Python's
    allocations, traced in a call of its own)."""
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    seconds = (time.perf_counter() - start) / repeat
    tracemalloc.start()
    call()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak / 2**20


def any_key_stored(keys: int, directory: Path) -> tuple[float, float]:
    from app.keys import KeyStore

    store = KeyStore(directory / "keys.db")
    store.add(10)
    db = store._connect(create=True)  # the rest written at once (`add` commits each)
    db.executemany("INSERT INTO api_key_digests VALUES (?, ?, ?, ?, ?)",
                   [(f"{i:064x}", "hint", 10, None, float(i)) for i in range(keys - 1)])
    db.commit()
    return timed(lambda: bool(store), 20)


def glossaries_listed(owners: int) -> tuple[float, float] | None:
    if shutil.which("redis-server") is None:
        return None
    from app.glossaries import RedisGlossaryStore, new_glossary, owner_of
    from bench.service import start_redis

    server, url = start_redis()
    try:
        store = RedisGlossaryStore(url)
        entries = {f"term{i:05d} " + "x" * 900: "y" * 100 for i in range(5000)}  # ~5 MB, the most entries
        for k in range(owners):
            store.put(new_glossary("big", "en", "de", entries, owner_of(f"key{k}")))
        store.put(new_glossary("small", "en", "de", {"file": "Akte"}, owner_of("me")))
        found = timed(lambda: store.list(owner_of("me")), 3)
        store.close()
        return found
    finally:
        server.terminate()
        server.wait(20)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the checkout whose app/ is measured")
    p.add_argument("--budget-mib", type=float, default=64, help="the kind's byte budget (NMT_CACHE_BYTES: 64 MiB)")
    p.add_argument("--value-bytes", type=int, default=250, help="mean bytes of a stored value (each one half to "
                   "one and a half times that)")
    p.add_argument("--after", type=int, default=100_000, help="puts timed once the budget is full")
    p.add_argument("--keys", type=int, default=100_000, help="API keys in the SQLite key store")
    p.add_argument("--glossary-owners", type=int, default=20, help="other keys with a 5 MB glossary each (Redis)")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ (its start_redis)
    sys.path.insert(0, str(args.tree))  # first: app/ comes from the tree measured

    await memory_puts(args)
    with tempfile.TemporaryDirectory() as tmp:
        any_key = any_key_stored(args.keys, Path(tmp))
    listed = glossaries_listed(args.glossary_owners)
    print(f"\n{args.tree}: one call beside others' stored state")
    print("| call | beside | ms a call | MiB one call held |")
    print("|---|---|---:|---:|")
    print(f"| is any API key stored (every DeepL call) | {args.keys:,} keys in SQLite | {any_key[0] * 1e3:.2f} | "
          f"{any_key[1]:.1f} |")
    beside = f"{args.glossary_owners} keys' 5 MB glossaries in Redis"
    print(f"| one key's glossaries listed | {beside} | "
          + ("no redis-server | |" if listed is None else f"{listed[0] * 1e3:.1f} | {listed[1]:.1f} |"))


if __name__ == "__main__":
    asyncio.run(main())
