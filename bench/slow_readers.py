"""Clients that ask for attention and never read the answer: how much the server's memory grows.

    .venv/bin/python bench/slow_readers.py [--clients 120] [--budget 16000000] [--seconds 25] [--interval 0]
        [--addresses N]

Starts `nmt serve` with the shipped en-de and NMT_ATTENTION_IN_FLIGHT_VALUES=--budget, then opens
--clients connections, each sending one /v1/translate request for the attention of a long text
(330 words, ~1.6 million attention values counted before decoding) and reading nothing; prints
the server process's resident memory before and at its peak over --seconds (sampled with /health
polled meanwhile, whose worst time it prints too), then each request's status. Past the budget
requests get 429 (app/in_flight.py); a budget of 1e11 is none. With --interval the clients come
one at a time, that many seconds apart (all of them within --seconds), so that each arrives
after the answers before it were written. The clients come from --addresses loopback addresses
(by default one each, 127.1.x.y, so that the budget is what holds them; with 1, all from one
address, which may hold NMT_CLIENT_SHARE_IN_FLIGHT of it).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
from service import wait_ready

ROOT = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=120)
    p.add_argument("--budget", default="16000000", help="NMT_ATTENTION_IN_FLIGHT_VALUES")
    p.add_argument("--seconds", type=float, default=25)
    p.add_argument("--interval", type=float, default=0, help="seconds between one client and the next")
    p.add_argument("--addresses", type=int, help="loopback addresses the clients come from (default: one each)")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "NMT_MODEL_DIRS": "checkpoints/en-de", "NMT_CACHE": "false",
           "NMT_ATTENTION_IN_FLIGHT_VALUES": args.budget}
    server = subprocess.Popen([str(ROOT / ".venv/bin/nmt"), "serve", "--port", str(port)], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    connections = []
    try:
        wait_ready(url, server)
        sentence = "The configuration file could not be opened because the disk is full so please free some space "
        words = (sentence + "and try again later").split(" ")
        text = " ".join(words[i % len(words)] for i in range(330)) + "."
        body = json.dumps({"text": text, "source": "en", "target": "de", "beam_size": 2,
                           "include_attention": True}).encode()
        request = (b"POST /v1/translate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body)) + body
        before = peak = rss_mib(server.pid)
        health, start, next_client = [], time.monotonic(), time.monotonic()
        while time.monotonic() - start < args.seconds or len(connections) < args.clients:
            while len(connections) < args.clients and time.monotonic() >= next_client:
                k = len(connections) % (args.addresses or args.clients)
                connection = socket.create_connection(("127.0.0.1", port), source_address=(f"127.1.{k // 250}.{k % 250 + 1}", 0))
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                connection.sendall(request)
                connections.append(connection)
                next_client += args.interval
            peak = max(peak, rss_mib(server.pid))
            t = time.perf_counter()
            httpx.get(f"{url}/health", timeout=30)
            health.append(time.perf_counter() - t)
            if health[-1] > 0.1:
                print(f"  /health took {1000 * health[-1]:.0f} ms at {t - start:.1f} s")
            time.sleep(0.2)
        statuses: dict[str, int] = {}
        for connection in connections:
            connection.settimeout(60)
            head = connection.recv(64)
            status = head.split(b" ")[1].decode() if head else "no answer"
            statuses[status] = statuses.get(status, 0) + 1
        print(f"NMT_ATTENTION_IN_FLIGHT_VALUES={args.budget}, {args.clients} clients that do not read, from "
              f"{args.addresses or args.clients} address(es): server "
              f"{before} MiB -> peak {peak} MiB (+{peak - before}); statuses {dict(sorted(statuses.items()))}; "
              f"/health at worst {1000 * max(health):.0f} ms")
    finally:
        for connection in connections:
            connection.close()
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
