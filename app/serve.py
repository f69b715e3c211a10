"""`nmt serve`: run the service under uvicorn.

NMT_HTTP_PROCESSES=1 (and 0, the default, on the CPU): one process serves HTTP and holds the engine
(app/engine.py), whose workers are its children. N > 1 (and 0 on a GPU host of 8 cores or more):
this process starts the engine in a process of its own and keeps it running (`EngineProcess`),
then uvicorn's supervisor runs N HTTP processes on the one port (uvicorn restarts one that dies);
they reach the engine over a Unix socket in a directory only this user can enter, keep what a
request may store where each sees what the others stored (Redis at NMT_REDIS_URL, else the engine
process's memory), and write their metrics where every process's /metrics can sum them
(PROMETHEUS_MULTIPROC_DIR).
SIGTERM / Ctrl-C stop accepting, finish in-flight requests, then stop the engine and its workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.engine import engine_main, visible_cuda_devices
from app.main import create_app
from app.registry import as_checkpoints
from app.settings import Settings

log = logging.getLogger("uvicorn.error")
HEALTHCHECK_TIMEOUT_S = 120  # an HTTP process silent this long is taken as hung, and replaced


def serve(host: str | None, port: int | None, model_dirs: list[str] | None) -> None:
    """Serve model_dirs on host:port (None: NMT_MODEL_DIRS, NMT_HOST, NMT_PORT)."""
    settings = Settings()
    if model_dirs:
        settings = settings.model_copy(update={"model_dirs": list(model_dirs)})
    # proxy_headers off: uvicorn would otherwise take X-Forwarded-For from any loopback peer as the
    # client's address, whatever NMT_TRUST_FORWARDED_FOR says; the service reads it itself when told to
    options = dict(host=host or settings.host, port=port or settings.port, log_level="info", proxy_headers=False,
                   access_log=settings.access_log, timeout_graceful_shutdown=int(settings.shutdown_timeout_s) or None,
                   http=functools.partial(HeadLimitProtocol, head_timeout_s=settings.read_timeout_s,
                                          max_head_bytes=settings.max_head_bytes))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    processes = settings.http_process_count(visible_cuda_devices(), cores)
    if processes == 1:
        uvicorn.run(create_app(settings), **options)
        return
    _serve_processes(settings.model_copy(update={"http_processes": processes}), options)


def _serve_processes(settings: Settings, options: dict) -> None:
    """NMT_HTTP_PROCESSES > 1: the engine process, then uvicorn's supervisor with the HTTP processes."""
    run_dir = Path(tempfile.mkdtemp(prefix="nmt-serve-"))  # mode 0700: the engine's socket is this user's alone
    try:
        # Argos packages are converted once, here, and every process reads the checkpoints
        directories = as_checkpoints(settings.model_dirs, settings.model_cache)
        (run_dir / "metrics").mkdir()
        os.environ.update(NMT_MODEL_DIRS=json.dumps(directories), NMT_ENGINE_SOCKET=str(run_dir / "engine.sock"),
                          PROMETHEUS_MULTIPROC_DIR=str(run_dir / "metrics"))
        engine = EngineProcess(Settings())  # the environment's settings, as the HTTP processes read them
        engine.start()
        try:
            # the engine process loads the language detector (~20 s on 2 cores with NMT_DETECT_PRELOAD,
            # its Rust code holding the GIL) while its workers start; the HTTP processes ask it
            uvicorn.run("app.main:create_app", factory=True, workers=settings.http_processes,
                        timeout_worker_healthcheck=HEALTHCHECK_TIMEOUT_S, **options)
        finally:
            engine.stop(settings.shutdown_timeout_s + 15)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


class HeadLimitProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools) with a deadline and a size for each request's head
    (request line and headers). A connection that has not sent a whole head within
    NMT_READ_TIMEOUT_S of opening, or of the first byte of its next request, is closed; a head
    past NMT_MAX_HEAD_BYTES gets 431 and the connection closed. uvicorn has neither: a connection
    that sends nothing, or a header line now and then, stayed open for good (enough of them, each
    a file descriptor, leave none for anyone else), and one header or URL of 20 MiB held 20 MiB
    for as long as its head was unfinished. A body that stops arriving is the app's to answer
    (app/body_limit.py: 408)."""

    def __init__(self, *args, head_timeout_s: float, max_head_bytes: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.head_timeout_s, self.max_head_bytes = head_timeout_s, max_head_bytes
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_bytes: int | None = 0  # bytes received of the head not yet complete; None: no head pending
        self._refused = False

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head_bytes is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_bytes is not None and self._head_bytes > self.max_head_bytes and not self._refused:
            self._refuse_head()

    def on_message_begin(self) -> None:  # the first byte of a request
        super().on_message_begin()
        self._await_head()

    def on_headers_complete(self) -> None:
        self._head_arrived()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self._head_bytes is None:
            self._head_bytes = 0
        if self._head_deadline is None:
            self._head_deadline = self.loop.call_later(self.head_timeout_s, self._head_too_slow)

    def _head_arrived(self) -> None:
        self._head_bytes = None
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        self.transport.close()

    def _refuse_head(self) -> None:
        self._refused = True
        self._head_arrived()
        body = json.dumps({"error": f"request line and headers larger than {self.max_head_bytes:,} bytes "
                                    "(NMT_MAX_HEAD_BYTES)"}).encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        self.transport.close()


class EngineProcess:
    """The engine in a process of its own (app/engine.py: engine_main), started again if it dies;
    the HTTP processes reconnect by themselves."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._context = multiprocessing.get_context("spawn")  # the workers it spawns use CUDA
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.process = None
        self._stop = None  # our end of the pipe the engine watches: a message or its closing stops it

    def start(self) -> None:
        self._spawn()
        threading.Thread(target=self._watch, name="nmt-engine-watch", daemon=True).start()

    def _spawn(self) -> None:
        self._stop, theirs = self._context.Pipe()
        self.process = self._context.Process(target=engine_main, name="nmt-engine",
                                             args=(self.settings, self.settings.engine_socket, theirs))
        self.process.start()
        theirs.close()

    def _watch(self) -> None:
        while True:
            self.process.join()
            if self._stopping.wait(1.0):  # (a second between starts, should it fail at once)
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                log.error("the engine process exited (exit code %s); starting it again", self.process.exitcode)
                self._spawn()

    def stop(self, timeout_s: float) -> None:
        """It finishes what it holds (NMT_SHUTDOWN_TIMEOUT_S), then stops its workers."""
        with self._lock:
            self._stopping.set()
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self._stop.send("stop")
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
