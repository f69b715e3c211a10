"""Service throughput and latency under concurrent clients, next to the offline Translator.

    python bench/service.py --model checkpoints/en-de [--clients 64] [--seconds 30] [--url URL]
    python bench/service.py --model checkpoints/en-de --rate 100 --client raw   # open loop

N clients (httpx, async) each send one sentence per request to /v1/translate, back to back, for
T seconds (closed loop). With --rate R the load is open: requests arrive as a Poisson process of
R a second, each on a free keep-alive connection (a new one when none is free), whatever the
server's pace, and each request's latency counts from its arrival, so time spent queued behind a
slow batch shows (a closed loop hides it: its clients wait instead of sending). With --servers N,
N servers are started, each with its own workers (replicas on one machine, as behind a load
balancer; the clients are spread over them round robin), and the numbers are their sum. Without
--url the server is started here (uvicorn app.main:app on 127.0.0.1, settings from
--workers/--threads-per-worker/... or the NMT_* environment). Then the offline Translator
translates the same sentences in one call (length-sorted token-budget batches), with 1 thread
and with all cores, and on a CPU also as `nmt translate --parallel N` does (N batches at once, one
thread each, N the cores), for comparison. Tokens are source tokens (EOS included), counted with the
model's tokenizer. The clients share the machine with the server: on few cores they take a
visible part of it. The clients repeat sentences, so a started server runs without its
translation cache (NMT_CACHE=false), and with --alignments without a client's quota of stored
alignments (NMT_CLIENT_ALIGNMENT_BYTES=0: the clients share one address); a server given with --url
runs as it is configured. With --health a process of its own polls the first server's /health
every 20 ms meanwhile (how fast the server answers what is not a translation while it decodes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sentences import load_sentences, sentences_used  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen, seconds: float = 120) -> None:
    """Until the server at `url` (started as `process`) answers /ready with 200; an AssertionError
    if it exits or takes longer."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(f"{url}/ready").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and process.poll() is None, "the server did not get ready"
        time.sleep(0.5)


def start_redis() -> tuple[subprocess.Popen, str]:
    """A throwaway redis-server (Debian's) on a free port, for --redis."""
    port = free_port()
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip() != "PONG":
        if time.monotonic() > deadline:
            sys.exit("redis-server did not start")
        time.sleep(0.05)
    return process, f"redis://127.0.0.1:{port}/0"


def start_server(args, redis_url: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "NMT_MODEL_DIRS": args.model}
    for name in ("workers", "threads_per_worker", "max_wait_ms", "batch_tokens", "device", "dtype", "running_batch"):
        value = getattr(args, name)
        if value is not None:
            env[f"NMT_{name.upper()}"] = str(value)
    env.setdefault("NMT_MAX_QUEUE_ITEMS", str(max(4096, 4 * args.clients)))
    env.setdefault("NMT_CACHE", "false")  # the clients repeat sentences: measure decoding, not the cache
    if args.alignments:  # the clients share one address, whose quota of stored alignments would soon answer 429
        env.setdefault("NMT_CLIENT_ALIGNMENT_BYTES", "0")
    if args.no_shortlist:
        env["NMT_SHORTLIST"] = "false"
    if redis_url:
        env["NMT_REDIS_URL"] = redis_url
    if args.http_processes > 1:  # `nmt serve` itself: it starts the engine process and the HTTP processes
        env.update(NMT_HTTP_PROCESSES=str(args.http_processes), NMT_ACCESS_LOG="false")
        command = [sys.executable, "-m", "nmt", "serve", "--host", "127.0.0.1", "--port", str(port)]
    else:  # as `nmt serve` runs it
        command = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port),
                   "--log-level", "warning", "--no-proxy-headers"]
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, 600)
    except AssertionError:
        process.terminate()
        sys.exit(f"server not ready (exit code {process.poll()})")
    return process, url


def poll_health(url: str, stop, out) -> None:
    """In a process of its own (the load's event loop would delay it): GET url/health every 20 ms,
    one keep-alive connection, until `stop` is set; puts the latencies (s) in `out`, or, should a poll
    fail, those before it."""
    import http.client

    host, port = url.split("//", 1)[1].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    latencies = []
    try:
        while not stop.is_set():
            start = time.perf_counter()
            connection.request("GET", "/health")
            connection.getresponse().read()
            latencies.append(time.perf_counter() - start)
            stop.wait(0.02)
    finally:
        connection.close()
        out.put(latencies)


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def process_tree(pid: int) -> list[int]:
    """pid and its descendants (Linux /proc)."""
    children = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return [pid] + [p for c in children for p in process_tree(c)]


def loaded_torch(pid: int) -> bool:
    """Whether the process mapped libtorch: the workers do; the HTTP and engine processes never."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def process_tree_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of the server's processes: its workers (they load torch), with several HTTP
    processes the engine process (the workers' parent), and the rest (HTTP, or HTTP and engine in one)."""
    tree = process_tree(pid)
    workers = [p for p in tree if loaded_torch(p)]
    engines = [p for p in tree if p != pid and p not in workers and set(process_tree(p)[1:]) & set(workers)]
    return {"server": sum(cpu_seconds(p) for p in tree if p not in workers and p not in engines),
            "engine": sum(cpu_seconds(p) for p in engines), "workers": sum(cpu_seconds(p) for p in workers)}


def metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


class RawConnection:
    """A minimal HTTP/1.1 keep-alive JSON client on asyncio streams. httpx costs this 2-core box
    about half a core at ~100 requests/s, taken from the server it measures; this costs a tenth
    of that. It reads only Content-Length bodies, which is what the service sends."""

    def __init__(self, url: str):
        self.host, self.port = url.split("//", 1)[1].rsplit(":", 1)
        self.streams = None

    async def post(self, path: str, payload: dict) -> tuple[int, bytes]:
        reused = self.streams is not None
        try:
            return await self._post(path, payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            if not reused:
                raise
            self.close()  # the server closed it while it sat idle (keep-alive timeout): once more, anew
            self.streams = None
            return await self._post(path, payload)

    async def _post(self, path: str, payload: dict) -> tuple[int, bytes]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, int(self.port))
        reader, writer = self.streams
        data = json.dumps(payload).encode()
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        length = next(int(h.split(":", 1)[1]) for h in head[1:] if h.lower().startswith("content-length:"))
        return status, await reader.readexactly(length)

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()


async def load_test(urls: list[str], sentences: list[str], pair: dict, args, server_pids: list[int]) -> dict:
    latencies: list[float] = []
    sent: list[int] = []
    errors: dict[int, int] = {}
    next_index = iter(range(10**9))
    stop_at = 0.0

    def record(i: int, status: int, start: float) -> None:
        if status == 200:
            latencies.append(time.perf_counter() - start)
            sent.append(i)
        else:
            errors[status] = errors.get(status, 0) + 1

    def body(i: int) -> dict:
        return {"text": sentences[i], **pair, "beam_size": args.beam_size, **({"alignments": True} if args.alignments else {}),
                **({"max_length": args.max_length} if args.max_length else {})}

    async def httpx_client(http: httpx.AsyncClient):
        while time.perf_counter() < stop_at:
            i = next(next_index) % len(sentences)
            start = time.perf_counter()
            r = await http.post("/v1/translate", json=body(i))
            record(i, r.status_code, start)

    async def raw_client(url: str):
        connection = RawConnection(url)
        while time.perf_counter() < stop_at:
            i = next(next_index) % len(sentences)
            start = time.perf_counter()
            status, _ = await connection.post("/v1/translate", body(i))
            record(i, status, start)
        connection.close()

    idle: list = []  # open loop: keep-alive connections free for the next arrival

    async def arrival(i: int, arrived: float, http: httpx.AsyncClient):
        if args.client == "raw":
            connection = idle.pop() if idle else RawConnection(urls[i % len(urls)])
            status, _ = await connection.post("/v1/translate", body(i))
            idle.append(connection)
        else:
            status = (await http.post("/v1/translate", json=body(i))).status_code
        record(i, status, arrived)

    async def open_loop(http: httpx.AsyncClient):
        """Poisson arrivals at args.rate a second until stop_at, each answered on its own task."""
        rng, tasks, at = random.Random(0), [], time.perf_counter()
        while True:
            at += rng.expovariate(args.rate)
            if at >= stop_at:
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks.append(asyncio.create_task(arrival(next(next_index) % len(sentences), at, http)))
        await asyncio.gather(*tasks)
        for connection in idle:
            connection.close()

    def server_cpu() -> dict[str, float]:
        trees = [process_tree_cpu(pid) for pid in server_pids]
        return {k: sum(tree[k] for tree in trees) for k in ("server", "engine", "workers")} if trees else {}

    async def metrics(http: httpx.AsyncClient) -> str:
        return "\n".join([(await http.get(f"{url}/metrics")).text for url in urls])

    connections = 4096 if args.rate else args.clients  # open loop: never a client-side queue
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=urls[0], timeout=120, limits=limits) as http:
        for url in urls:
            for i in range(4):  # warm-up: first-call costs stay out of the numbers
                await http.post(f"{url}/v1/translate", json=body(i))
        before = await metrics(http)
        if args.health:
            spawn = multiprocessing.get_context("spawn")
            stop_polling, polled = spawn.Event(), spawn.Queue()
            poller = spawn.Process(target=poll_health, args=(urls[0], stop_polling, polled), daemon=True)
            poller.start()
        cpu_before = (time.process_time(), server_cpu())
        start = time.perf_counter()
        stop_at = start + args.seconds
        if args.rate:
            await open_loop(http)
        else:  # (the httpx clients send to the first server only)
            await asyncio.gather(*((raw_client(urls[c % len(urls)]) if args.client == "raw" else httpx_client(http))
                                   for c in range(args.clients)))
        elapsed = time.perf_counter() - start
        cpu = {"clients": time.process_time() - cpu_before[0]}
        cpu.update({k: v - cpu_before[1][k] for k, v in server_cpu().items()})
        health = []
        if args.health:
            stop_polling.set()
            health = polled.get(timeout=120)
            poller.join(10)
        after = await metrics(http)
    batches = metric(after, "nmt_batch_size_count") - metric(before, "nmt_batch_size_count")
    items = metric(after, "nmt_batch_size_sum") - metric(before, "nmt_batch_size_sum")
    busy = metric(after, "nmt_worker_busy_seconds_total") - metric(before, "nmt_worker_busy_seconds_total")
    padded = metric(after, "nmt_batch_tokens_sum") - metric(before, "nmt_batch_tokens_sum")

    def mean_ms(name: str) -> float:  # a histogram of the server's: its mean over the load
        count = metric(after, f"{name}_count") - metric(before, f"{name}_count")
        return 1000 * (metric(after, f"{name}_sum") - metric(before, f"{name}_sum")) / count if count else 0.0

    return {"elapsed": elapsed, "latencies": latencies, "sent": sent, "errors": errors, "health": health,
            "mean_batch": items / batches if batches else 0.0, "busy_s": busy, "padded_tokens": padded, "cpu": cpu,
            "queue_wait_ms": mean_ms("nmt_queue_wait_seconds"), "compute_ms": mean_ms("nmt_compute_seconds")}


def offline(model: str, sentences: list[str], threads: int, args, parallel: int = 1) -> tuple[float, int]:
    import torch

    from app.settings import Settings
    from model.translator import Translator

    torch.set_num_threads(threads)
    translator = Translator.load(model, device=None if args.device in (None, "auto") else args.device,
                                 dtype=args.dtype or "auto", shortlist=not args.no_shortlist)
    translator.translate(sentences[:4], beam_size=args.beam_size)  # warm-up
    # the service's budget: NMT_BATCH_TOKENS, else its default for the device
    budget = Settings(batch_tokens=args.batch_tokens or 0).batch_token_budget(translator.device.type)
    start = time.perf_counter()
    translator.translate(sentences, beam_size=args.beam_size, batch_tokens=budget, parallel=parallel)
    return time.perf_counter() - start, sum(len(translator.encode(s)) for s in sentences)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="checkpoints/en-de", help="checkpoint directory (served, and run offline)")
    p.add_argument("--data", default="data/corpus/test_sw.en",
                   help="one sentence per line, or prose@REV: the repository's Markdown prose at REV "
                   "(bench/sentences.py); built-in if missing")
    p.add_argument("--limit", type=int, default=1000, help="use the first N sentences")
    p.add_argument("--clients", type=int, default=64, help="closed loop: clients sending back to back")
    p.add_argument("--rate", type=float, default=0.0, help="open loop instead: Poisson arrivals of this many "
                   "requests a second, latency counted from each arrival")
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--max-length", type=int, help="each request's max_length (target tokens): with a tiny model, "
                   "what is left to measure is the HTTP side")
    p.add_argument("--client", choices=["httpx", "raw"], default="httpx",
                   help="load generator: httpx.AsyncClient, or a minimal asyncio HTTP/1.1 client that leaves "
                   "more of a small machine to the server")
    p.add_argument("--url", help="benchmark this running server instead of starting one")
    p.add_argument("--servers", type=int, default=1, help="start this many servers, each with its own workers, "
                   "and spread the raw clients over them (replicas on one machine)")
    p.add_argument("--http-processes", type=int, default=1, help="NMT_HTTP_PROCESSES: the server is `nmt serve` "
                   "with this many HTTP processes in front of one engine process (which keeps their store, "
                   "unless --redis)")
    p.add_argument("--redis", action="store_true", help="the started servers keep their store in a redis-server "
                   "started here (NMT_REDIS_URL)")
    p.add_argument("--workers", type=int, help="NMT_WORKERS for the started server")
    p.add_argument("--threads-per-worker", type=int, help="NMT_THREADS_PER_WORKER")
    p.add_argument("--max-wait-ms", type=float, help="NMT_MAX_WAIT_MS")
    p.add_argument("--batch-tokens", type=int, help="NMT_BATCH_TOKENS (also the offline batch budget)")
    p.add_argument("--device", help="NMT_DEVICE (and the offline Translator's)")
    p.add_argument("--dtype", help="NMT_DTYPE (and the offline Translator's)")
    p.add_argument("--offline-threads", help="torch threads of the offline runs, comma-separated (default: 1 and "
                   "all cores); the ratio is against the fastest")
    p.add_argument("--no-offline", action="store_true", help="skip the offline comparison")
    p.add_argument("--no-shortlist", action="store_true", help="NMT_SHORTLIST=false (and the offline Translator "
                   "without the model's vocabulary shortlist)")
    p.add_argument("--alignments", action="store_true", help="every request asks for its attention alignments "
                   "(stored by the server: NMT_ALIGNMENT_STORE)")
    p.add_argument("--running-batch", choices=["auto", "true", "false"], help="NMT_RUNNING_BATCH")
    p.add_argument("--health", action="store_true", help="poll the first server's /health every 20 ms during "
                   "the load, from a process of its own, and print its latencies")
    p.add_argument("--json", help="also write the numbers here")
    args = p.parse_args()

    sentences = load_sentences(args.data, args.limit)
    if args.servers > 1 and (args.url or args.client != "raw"):
        sys.exit("--servers needs the raw client and no --url")
    redis = start_redis() if args.redis and not args.url else None
    started: list[tuple[subprocess.Popen, str]] = []
    try:  # (what started is stopped, even when a later server never gets ready)
        for _ in range(0 if args.url else args.servers):
            started.append(start_server(args, redis and redis[1]))
        urls = [args.url] if args.url else [url for _, url in started]
        model = httpx.get(f"{urls[0]}/v1/models").json()["models"][0]
        pair = {"source": model["source"], "target": model["target"]}
        run = asyncio.run(load_test(urls, sentences, pair, args, [process.pid for process, _ in started]))
        workers = [w for url in urls for w in httpx.get(f"{url}/ready").json()["workers"]]
    finally:
        for process, _ in started:
            process.terminate()
        for process, _ in started:
            process.wait(60)
        if redis:
            redis[0].terminate()

    from app.registry import load_model

    served = load_model(args.model) if Path(args.model).is_dir() else None
    done = len(run["sent"])
    lat = sorted(x * 1000 for x in run["latencies"])
    load = f"open loop, {args.rate:g} requests/s Poisson" if args.rate else f"{args.clients} clients"
    servers = f"{len(urls)} servers x {len(workers) // len(urls)} worker(s)" if len(urls) > 1 else f"{len(workers)} worker(s)"
    if args.http_processes > 1:
        servers += f", {args.http_processes} HTTP processes"
    rows = [{"what": f"service: {load} ({args.client}), {servers}, {model['dtype']}",
             "sentences_per_s": done / run["elapsed"],
             "tokens_per_s": (sum(len(served.tokenizer.encode_source(sentences[i])) for i in run["sent"]) / run["elapsed"]
                              if served else None),
             "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95), "p99_ms": percentile(lat, 99)}]
    if not args.no_offline and served:
        # the very sentences the service translated, repeats included (a short --data list, or the
        # built-in one, is cycled through): the same work, in one call
        translated = [sentences[i] for i in run["sent"]] or sentences[:1]
        cores = os.cpu_count() or 1
        runs = [(int(t), 1) for t in sorted({int(t) for t in (args.offline_threads or f"1,{cores}").split(",")})]
        if cores > 1 and (args.device or "cpu") == "cpu":
            runs.append((1, cores))  # `nmt translate --parallel N`: a batch per core
        for threads, parallel in runs:
            seconds, tokens = offline(args.model, translated, threads, args, parallel)
            how = f"{threads} thread(s)" if parallel == 1 else f"parallel {parallel} (1 thread each)"
            rows.append({"what": f"offline Translator, one call, {how}",
                         "sentences_per_s": len(translated) / seconds, "tokens_per_s": tokens / seconds,
                         "p50_ms": None, "p95_ms": None, "p99_ms": None})

    print(f"\nsentences: {sentences_used(args.data, sentences)}")
    print(f"{done} sentences in {run['elapsed']:.1f} s, beam {args.beam_size}, mean batch "
          f"{run['mean_batch']:.1f} items, workers busy {100 * run['busy_s'] / run['elapsed'] / len(workers):.0f}%"
          + (f", padded source tokens {run['padded_tokens'] / (rows[0]['tokens_per_s'] * run['elapsed']):.2f}x the "
             "sentences' own" if rows[0]["tokens_per_s"] else "")
          + (f", errors {run['errors']}" if run["errors"] else ""))
    print(f"in the server, per request: mean queue wait {run['queue_wait_ms']:.0f} ms (arrival to its batch's start), "
          f"mean compute {run['compute_ms']:.0f} ms (to its last result)")
    print("CPU cores used meanwhile: " + ", ".join(f"{k} {v / run['elapsed']:.2f}" for k, v in run["cpu"].items())
          + f" (of {os.cpu_count()}); CPU ms a request answered 200{' (errors cost CPU too)' if run['errors'] else ''}: "
          + ", ".join(f"{k} {1000 * v / max(done, 1):.2f}" for k, v in run["cpu"].items()))
    health = sorted(1000 * x for x in run["health"])
    if health:
        print(f"/health meanwhile ({len(health)} polls, every 20 ms, from a process of its own): p50 "
              f"{percentile(health, 50):.1f} ms, p99 {percentile(health, 99):.1f} ms, longest {health[-1]:.1f} ms")
    print("| run | sentences/s | source tokens/s | p50 ms | p95 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    fmt = lambda v, d=1: "" if v is None else f"{v:.{d}f}"  # noqa: E731
    for r in rows:
        print(f"| {r['what']} | {fmt(r['sentences_per_s'])} | {fmt(r['tokens_per_s'], 0)} | {fmt(r['p50_ms'], 0)} "
              f"| {fmt(r['p95_ms'], 0)} | {fmt(r['p99_ms'], 0)} |")
    if served and lat:
        # where the tail is: latency by the request's source length
        print("\n| source tokens | requests | p50 ms | p99 ms |\n|---|---:|---:|---:|")
        lengths = [len(served.tokenizer.encode_source(sentences[i])) for i in run["sent"]]
        for low, high in ((1, 8), (9, 16), (17, 32), (33, 64), (65, 10**6)):
            chosen = sorted(1000 * x for x, n in zip(run["latencies"], lengths) if low <= n <= high)
            if chosen:
                label = f"{low}-{high}" if high < 10**6 else f"{low}+"
                print(f"| {label} | {len(chosen)} | {percentile(chosen, 50):.0f} | {percentile(chosen, 99):.0f} |")
    if len(rows) > 1:
        best = max(r["sentences_per_s"] for r in rows[1:])
        print(f"\nservice / fastest offline throughput: {rows[0]['sentences_per_s'] / best:.2f}x (target >= 0.8x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "mean_batch": run["mean_batch"], "busy_s": run["busy_s"],
                                               "queue_wait_ms": run["queue_wait_ms"], "compute_ms": run["compute_ms"],
                                               "errors": run["errors"], "args": vars(args),
                                               "health_ms": health,
                                               "sentences": sentences_used(args.data, sentences),
                                               # (sentence index, latency s) of every answered request
                                               "requests": list(zip(run["sent"], run["latencies"]))}, indent=2))


if __name__ == "__main__":
    main()
