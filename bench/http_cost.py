"""What one request costs the HTTP process's CPU, without uvicorn, sockets from clients or load
generators on the same cores: the app (app.main.create_app, its workers real processes) called in-
process as ASGI on uvicorn's event loop (uvloop where installed), one request at a time, and this
process's CPU time (user and system) divided by the requests (the workers' own CPU is theirs, not
counted).

    .venv/bin/python bench/http_cost.py --model checkpoints/en-de [--requests 1000] [--idle-ms 0,7] [--cache]
    .venv/bin/python bench/http_cost.py --model checkpoints/en-de --profile OUT.prof   # cProfile of the
        # /v1/translate row, then a table of its time by package

Rows: what the middleware and routing cost (a GET /health, and a /v1/translate refused with a 400
before any work), then one sentence to translate through each API: /v1/translate, LibreTranslate's
/translate and DeepL's /v2/translate; and /v1/translate's request once more with max_length 2, which
its worker decodes in about a millisecond, and with 32 texts. Without `--cache` the translation
cache is off (the rows' sentences repeat); with it, as a server runs by default, every text is
another (a number before each sentence), so each request looks up and stores its sentences, a row
of one sentence asked again and again shows a hit, and a column counts each row's hits.

Columns: each request sent back to back, or after the process slept a while (as a server between
requests that come now and then; a translated sentence's request always waits for its worker's
decoding): on a VM's vCPU what a request touches may be out of the caches by then, and the same
request costs several times the CPU. The server under load
(bench/service.py: "CPU ms a request") adds uvicorn's HTTP handling to these.

The profile's times are cProfile's: wall time, each call's share of the profiler's own cost
included. A write to a worker's socket (asyncio's StreamWriter.write) can show hundreds of
microseconds that are not CPU: the woken worker may take this process's core until the scheduler
moves one of them (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import itertools
import json
import os
import pstats
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sentences import load_sentences  # noqa: E402


async def call(app, method: str, path: str, body: bytes, content_type: str) -> int:
    """One ASGI request as uvicorn would hand it over; the response's status."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"bench"), (b"content-type", content_type.encode()),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {}}
    delivered = False

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected

    statuses = []

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(scope, receive, send)
    return statuses[0]


def requests(sentences: list[str], unique: int = 0) -> dict[str, list[tuple[str, str, bytes, str]]]:
    """Per row, the requests it cycles through: (method, path, body, content type). With `unique`,
    that many of each row's, a number put before every sentence (none twice: each misses the
    translation cache), and a row that sends one sentence again and again (each but the first a hit)."""
    as_json = "application/json"
    numbered = itertools.count()

    def each(path: str, body, texts_each: int = 0) -> list[tuple[str, str, bytes, str]]:
        """Requests of body(a sentence), or with `texts_each` body(a list of that many)."""
        count = (unique or len(sentences)) * max(texts_each, 1)
        # the number first: LibreTranslate's and DeepL's APIs cut a text into sentences, each cached alone
        texts = [f"{next(numbered)} {sentences[i % len(sentences)]}" if unique else sentences[i % len(sentences)]
                 for i in range(count)]
        if texts_each:
            texts = [texts[i:i + texts_each] for i in range(0, count, texts_each)]
        return [("POST", path, json.dumps(body(t)).encode(), as_json) for t in texts]

    hit = {"POST /v1/translate, one sentence again and again (a cache hit)": [
        ("POST", "/v1/translate", json.dumps({"text": sentences[0], "source": "en", "target": "de"}).encode(),
         as_json)]} if unique else {}
    return {**hit,
        "GET /health": [("GET", "/health", b"", as_json)],
        "POST /v1/translate, refused (400)": [("POST", "/v1/translate",
                                               json.dumps({"text": "", "source": "en", "target": "de"}).encode(),
                                               as_json)],
        "POST /v1/translate": each("/v1/translate", lambda s: {"text": s, "source": "en", "target": "de"}),
        "POST /v1/translate, max_length 2 (its worker answers in ~1 ms)": each(
            "/v1/translate", lambda s: {"text": s, "source": "en", "target": "de", "max_length": 2}),
        "POST /v1/translate, 32 texts, max_length 2": each(
            "/v1/translate", lambda t: {"text": t, "source": "en", "target": "de", "max_length": 2}, texts_each=32),
        "POST /translate (LibreTranslate)": each("/translate", lambda s: {"q": s, "source": "en", "target": "de"}),
        "POST /v2/translate (DeepL)": each("/v2/translate", lambda s: {"text": [s], "source_lang": "EN",
                                                                        "target_lang": "DE"}),
    }


def by_package(profile: str, count: int) -> None:
    """The profile's own time by package (or module of ours), per request."""
    found: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for (filename, _, name), (_, calls, own, _, _) in pstats.Stats(profile).stats.items():
        if filename == "~" and "poll" in name:
            continue  # waiting for the workers
        match = (re.search(r"site-packages/([^/]+)", filename) or re.search(r"/(app|model)/(\w+)", filename)
                 or re.search(r"python3\.\d+/(\w+)", filename))
        package = (match.group(0).lstrip("/") if match and match.group(1) in ("app", "model")
                   else match.group(1) if match else name)
        found[package][0] += calls
        found[package][1] += own
    total = sum(own for _, own in found.values())
    print(f"\n{profile}: own time by package, per request (with cProfile's cost of each call)")
    print("| package | calls | us | share |")
    print("|---|---:|---:|---:|")
    for package, (calls, own) in sorted(found.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"| {package[:60]} | {calls / count:.0f} | {own / count * 1e6:.0f} | {own / total:.0%} |")
    print(f"| all | | {total / count * 1e6:.0f} | |")


async def timed(app, cycle: list, first: int, count: int, idle_s: float, profile: cProfile.Profile | None):
    """CPU seconds a request (this process's, all its threads', user + system) over `count`
    requests from the `first` of `cycle` on, each sent after `idle_s` asleep, and their statuses."""
    statuses: collections.Counter = collections.Counter()
    cpu = 0.0
    for i in range(count):
        if idle_s:
            await asyncio.sleep(idle_s)
        before = time.process_time()
        if profile:
            profile.enable()
        statuses[await call(app, *cycle[(first + i) % len(cycle)])] += 1
        if profile:
            profile.disable()
        cpu += time.process_time() - before
    return cpu / count, statuses


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="checkpoints/en-de", help="an en-de checkpoint directory")
    p.add_argument("--data", default="prose@c7b0ed3", help="sentences (bench/sentences.py)")
    p.add_argument("--requests", type=int, default=1000, help="requests timed per row and idle time")
    p.add_argument("--idle-ms", default="0,7",
                   help="comma-separated: each request sent after this long asleep (one column each; 0: back to back)")
    p.add_argument("--cache", action="store_true", help="the translation cache on, as a server has it by default: "
                   "no text twice (a number put before each sentence: every request a miss that stores its "
                   "translation), and a row of one sentence sent again and again (a hit)")
    p.add_argument("--profile", help="write a cProfile of the /v1/translate row (back to back) here, and print it "
                   "by package")
    args = p.parse_args()
    idles = [float(ms) for ms in args.idle_ms.split(",")]
    # without --cache as bench/service.py starts its server: sentences repeat, so no translation cache
    os.environ.update(NMT_MODEL_DIRS=args.model, NMT_CACHE=str(args.cache).lower())
    from app.main import create_app

    app = create_app()
    # with the cache, every request of a row is another text (its warm-up's too)
    rows = requests(load_sentences(args.data, 100_000), unique=args.requests * len(idles) + 50 if args.cache else 0)
    async with app.router.lifespan_context(app):
        print(f"{args.requests} requests a cell, one at a time, {args.model}; this process's CPU (user + system) a "
              "request, in us, by how long it slept before each")
        print("| request | status | " + " | ".join("back to back" if not ms else f"after {ms:g} ms asleep"
                                                   for ms in idles) + " |" + " cache hits / lookups |" * args.cache)
        print("|---|---:|" + "---:|" * (len(idles) + args.cache))
        registry = app.state.service.metrics.registry
        lookups = lambda result: registry.get_sample_value("nmt_cache_lookups_total", {"result": result}) or 0  # noqa: E731
        for row, cycle in rows.items():
            for i in range(min(50, args.requests)):  # warm: first calls, the workers' first batches
                await call(app, *cycle[i % len(cycle)])
            hits, misses = lookups("hit"), lookups("miss")
            cells, statuses = [], collections.Counter()
            for column, ms in enumerate(idles):
                profile = (cProfile.Profile() if args.profile and row == "POST /v1/translate" and ms == idles[0]
                           else None)
                cpu, found = await timed(app, cycle, 50 + column * args.requests, args.requests, ms / 1000, profile)
                cells.append(f"{cpu * 1e6:.0f}")
                statuses.update(found)
                if profile:
                    profile.dump_stats(args.profile)
            if args.cache:  # what the timed requests found in the cache
                hits, misses = lookups("hit") - hits, lookups("miss") - misses
                cells.append(f"{hits:.0f} / {hits + misses:.0f}")
            status = ", ".join(f"{code} x{n}" if len(statuses) > 1 else str(code) for code, n in statuses.items())
            print(f"| {row} | {status} | " + " | ".join(cells) + " |")
    if args.profile:
        by_package(args.profile, args.requests)


if __name__ == "__main__":  # (the workers are spawned: they import this module without running it)
    try:  # the event loop uvicorn runs the server on, where installed
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())
