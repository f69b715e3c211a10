"""One request of many sentences and, while it runs, single sentences: how long do the singles wait?

    .venv/bin/python bench/bulk_and_single.py [--sentences 400] [--requests 1] [--url URL]

Starts `nmt serve` with the shipped en-de (no translation cache, no language detection) unless
--url names a running server; sends one LibreTranslate /translate request of --sentences
sentences (texts of 8 sentences each, from the Markdown prose at c7b0ed3, bench/sentences.py)
and, from 0.3 s after it until it is answered, one single sentence every 100 ms, each after the
answer to the one before, from another client address (127.0.0.2); prints the long request's time
and the singles' p50 and longest. With --requests N the long work goes as N requests at once (its
texts dealt out among them), as a client that sends its bulk in parallel does. The scheduler starts
each batch from the client with the fewest items in flight, then from the request least served so
far (app/scheduler.py), so a single waits for a worker to free, not for the whole long work.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from sentences import prose_sentences
from service import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]


async def measure(url: str, count: int, requests: int) -> None:
    sentences = prose_sentences("c7b0ed3")
    body = {"source": "en", "target": "de"}
    long_texts = [" ".join(sentences[(8 * k + j) % len(sentences)] for j in range(8)) for k in range(count // 8)]
    other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")  # the singles' client
    async with httpx.AsyncClient(base_url=url, timeout=600) as client, \
            httpx.AsyncClient(base_url=url, timeout=600, transport=other) as singles:
        await client.post("/translate", json={"q": sentences[:4], **body})  # warm-up
        start = time.perf_counter()
        bulk = [asyncio.create_task(client.post("/translate", json={"q": long_texts[r::requests], **body}))
                for r in range(requests)]
        await asyncio.sleep(0.3)
        waits, i = [], 0
        while not all(task.done() for task in bulk):
            sent = time.perf_counter()
            answer = await singles.post("/translate", json={"q": sentences[(7 * i) % len(sentences)], **body})
            assert answer.status_code == 200, answer.text[:300]
            waits.append(time.perf_counter() - sent)
            i += 1
            await asyncio.sleep(0.1)
        for answer in await asyncio.gather(*bulk):
            assert answer.status_code == 200, answer.text[:300]
        what = "one request" if requests == 1 else f"{requests} requests at once"
        print(f"{what} of {8 * len(long_texts)} sentences: {time.perf_counter() - start:.1f} s; {len(waits)} single "
              f"sentences meanwhile: p50 {1000 * statistics.median(waits):.0f} ms, longest {1000 * max(waits):.0f} ms "
              f"(each, in order: {', '.join(f'{1000 * w:.0f}' for w in waits)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=400, help="sentences of the long request (at most 64 x 8)")
    p.add_argument("--requests", type=int, default=1, help="the long work as this many requests sent at once")
    p.add_argument("--url", help="a running server instead of one started here")
    args = p.parse_args()
    if args.url:
        asyncio.run(measure(args.url, args.sentences, args.requests))
        return
    port = free_port()
    env = {**os.environ, "NMT_MODEL_DIRS": "checkpoints/en-de", "NMT_CACHE": "false", "NMT_DETECT_LANGUAGES": "none"}
    server = subprocess.Popen([sys.executable, "-m", "nmt", "serve", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, server)
        asyncio.run(measure(url, args.sentences, args.requests))
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
