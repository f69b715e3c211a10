"""Memory of `nmt serve` with several HTTP processes: each process's resident memory once /ready,
and which of them holds the language detector (lingua mapped), with the seconds to /ready.

    python bench/serve_memory.py --model checkpoints/en-de [--http-processes 2] [--detect-languages all]

The server on a free local port (the engine process keeps the HTTP processes' store: no Redis);
it is stopped after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service import free_port  # noqa: E402


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="checkpoints/en-de")
    p.add_argument("--http-processes", type=int, default=2)
    p.add_argument("--detect-languages", default="", help="NMT_DETECT_LANGUAGES (default: all 75)")
    args = p.parse_args()
    port = free_port()
    env = {**os.environ, "NMT_HTTP_PROCESSES": str(args.http_processes), "NMT_MODEL_DIRS": args.model,
           "NMT_WORKERS": "1", "NMT_DETECT_LANGUAGES": args.detect_languages}
    started = time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "nmt", "serve", "--host", "127.0.0.1", "--port", str(port)],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if server.poll() is not None:
                sys.exit(f"nmt serve exited with {server.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        ready_s = time.monotonic() - started
        print(f"/ready after {ready_s:.1f} s, {args.http_processes} HTTP processes\n")
        print("| process | resident MB | language detector |\n|---|---:|---|")
        total = 0.0
        for pid in children(server.pid):
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"resource_tracker" in command:
                continue
            role = "engine (and its workers' parent)" if children(pid) else "HTTP"
            lingua = "lingua" in Path(f"/proc/{pid}/maps").read_text()
            total += rss_mb(pid)
            print(f"| {role} | {rss_mb(pid):,.0f} | {'loaded' if lingua else '-'} |")
        print(f"| all but the workers | {total:,.0f} | |")
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
