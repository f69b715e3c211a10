"""Prometheus metrics, in a registry per app (tests build several apps in one process).

With several HTTP processes and an engine process (NMT_HTTP_PROCESSES > 1, app/serve.py), `nmt serve`
sets PROMETHEUS_MULTIPROC_DIR for all of them: each writes its values there, and /metrics, whichever
process answers it, sums them (prometheus_client's multiprocess mode). The engine's gauges are then
set by the engine process (`update_engine_gauges`), and the most recent value counts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

disable_created_metrics()  # the *_created series only double the output

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("nmt_requests", "HTTP requests by route template and status.",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("nmt_request_seconds", "HTTP request latency by route.", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("nmt_queue_wait_seconds", "Translate requests: arrival to first batch start.",
                                    ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.compute = Histogram("nmt_compute_seconds", "Translate requests: first batch start to last result.",
                                 ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("nmt_queue_depth", "Items waiting for a worker.", registry=r,
                                 multiprocess_mode="mostrecent")
        self.batches_in_flight = Gauge("nmt_batches_in_flight", "Batches running on workers.", registry=r,
                                       multiprocess_mode="mostrecent")
        self.batch_size = Histogram("nmt_batch_size", "Items per batch.", buckets=SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("nmt_batch_tokens", "Padded source tokens per batch (before beams).",
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.items = Counter("nmt_translated_items", "Texts translated.", ["model"], registry=r)
        self.generated_tokens = Counter("nmt_generated_tokens", "Target tokens of returned hypotheses (EOS "
                                        "included).", ["model"], registry=r)
        self.span_repairs = Counter("nmt_span_repairs", "Protected spans (placeholders, tags, URLs) a returned "
                                    "hypothesis lacked and got back where the attention points (kind=inserted), "
                                    "or repeated or unknown ones removed (kind=removed).", ["model", "kind"],
                                    registry=r)
        self.repaired = Counter("nmt_repaired_hypotheses", "Returned hypotheses that needed a span repair.",
                                ["model"], registry=r)
        self.term_retries = Counter("nmt_term_retries", "Sentences translated again, their glossary terms as "
                                    "sentinels, because a model that reads inline term annotations did not write "
                                    "one of them.", ["model"], registry=r)
        self.worker_busy = Counter("nmt_worker_busy_seconds", "Seconds each worker spent on batches.", ["worker"],
                                   registry=r)
        self.workers_alive = Gauge("nmt_workers_alive", "Workers able to take a batch.", registry=r,
                                   multiprocess_mode="mostrecent")
        self.worker_restarts = Gauge("nmt_worker_restarts", "Worker replacements after a death or hang.",
                                     registry=r, multiprocess_mode="mostrecent")
        self.rate_limited = Counter("nmt_rate_limited", "Calls refused with 429 for a client's requests per minute "
                                    "(NMT_REQ_LIMIT, a key's req_limit).", registry=r)
        self.cache_lookups = Counter("nmt_cache_lookups", "Translation cache lookups by result (hit rate: "
                                     "hit / (hit + miss)).", ["result"], registry=r)
        self.storage_errors = Counter("nmt_storage_errors", "Calls to the shared store (Redis) that failed, by "
                                      "what needed it.", ["use"], registry=r)
        self.files = Counter("nmt_translated_files", "Files translated, by extension.", ["extension"], registry=r)
        # the store's gauges: set by the process that holds the store (with several processes, the
        # engine process; 0 elsewhere, and with Redis, whose own metrics say it)
        self.file_bytes = Gauge("nmt_translated_file_bytes", "Bytes of translated files waiting to be downloaded.",
                                registry=r, multiprocess_mode="livesum")
        self.alignments = Gauge("nmt_alignments_stored", "Alignments in the store.", registry=r,
                                multiprocess_mode="livesum")
        self.alignment_bytes = Gauge("nmt_alignment_bytes", "Bytes of stored attention.", registry=r,
                                     multiprocess_mode="livesum")
        self._engine_gauges = (self.queue_depth, self.batches_in_flight, self.workers_alive, self.worker_restarts)
        self._engine_sample: Callable[[], tuple[int, int, int, int]] = lambda: (0, 0, 0, 0)

    def engine_gauges(self, sample: Callable[[], tuple[int, int, int, int]]) -> None:
        """The engine's gauges read `sample()`: (items queued, batches in flight, workers alive,
        worker restarts); at each scrape, or with several processes at each update_engine_gauges()."""
        self._engine_sample = sample
        for i, gauge in enumerate(self._engine_gauges):
            gauge.set_function(lambda i=i: sample()[i])

    def update_engine_gauges(self) -> None:
        for gauge, value in zip(self._engine_gauges, self._engine_sample()):
            gauge.set(value)

    def _store_readings(self, storage) -> dict[Gauge, Callable[[], float]]:
        return {self.alignments: lambda: storage.count("alignment"),
                self.alignment_bytes: lambda: storage.bytes.get("alignment", 0),
                self.file_bytes: lambda: storage.bytes.get("file", 0)}

    def store_gauges(self, storage) -> None:
        """The store's gauges read `storage` (a MemoryStorage) at each scrape."""
        for gauge, read in self._store_readings(storage).items():
            gauge.set_function(read)

    def update_store_gauges(self, storage) -> None:
        """With several processes (no scrape reaches a function of this one's): set them now."""
        for gauge, read in self._store_readings(storage).items():
            gauge.set(read())

    def exposition(self) -> bytes:
        """The Prometheus text of this process's metrics, or of every process's with several."""
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged)
        return generate_latest(merged)


class MetricsMiddleware:
    """Counts and times every HTTP request by its route template (a plain ASGI middleware: it
    leaves `receive` alone, so routes can still watch for a client's disconnect)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def send_and_record(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"  # no raw paths: bounded labels
            self.metrics.requests.labels(route, scope["method"], str(status[0])).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)
