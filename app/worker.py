"""Model workers: one process per model replica; each owns its device and a copy of every model.

Why processes, for CPU and CUDA alike (one mechanism): torch's intra-op thread count is per
process, so CPU replicas with their own thread count (on 2 cores, 2 workers x 1 thread can beat
1 x 2) must be processes; on CUDA a process per GPU keeps device work out of the server process,
and a crash (segfault, OOM kill, CUDA error) takes down one replica, which is restarted, not the
server. Processes are spawned (fork is unsafe with CUDA and with torch's thread pools).

The process itself is app/worker_process.py, the only place torch is imported. Each worker
talks to the server over a pipe (app/pipe.py): one batch in, its results out. The server side,
WorkerPool, hands each batch to an idle worker and turns a worker's exception into an error for
that batch only; a worker that dies or hangs is replaced, and `status()` says so meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from app.pipe import receive_message, send_message
from app.scheduler import BatchKey

log = logging.getLogger("uvicorn.error")


class WorkerError(Exception):
    """The batch failed in a worker (it raised, died or hung); only that batch's requests fail."""


def _worker_entry(*args) -> None:
    """A worker process's entry point. torch is imported here, in the worker, never in the server."""
    from app.worker_process import worker_main

    worker_main(*args)


@dataclass
class Worker:
    index: int
    device: str
    state: str = "stopped"  # starting | idle | busy | restarting | failed | stopped
    reason: str = ""
    cpu_kernels: bool = False  # whether its translators run the C++ CPU kernels (model/kernels/__init__.py)
    fused: bool = False  # whether an int8 model's encoder and decoder step run as one C++ call each
    int8_path: str | None = None  # which int8 product path (model/kernels/int8.cpp), when int8
    dtype: str | None = None  # the compute type its translators resolved ("auto" made concrete)
    loaded: list[str] = field(default_factory=list)  # the models it holds now (NMT_MAX_LOADED_MODELS)
    restarts: int = 0
    process: Any = None
    conn: Any = None
    busy_seconds: float = 0.0
    batches: int = 0

    @property
    def alive(self) -> bool:
        return self.state in ("idle", "busy")

    def roundtrip(self, message):
        send_message(self.conn, message)
        return receive_message(self.conn)


@dataclass
class WorkerPool:
    models: dict[str, str]  # model id -> checkpoint directory
    devices: list[str]  # one per worker
    threads: int = 1
    dtype: str = "float32"
    batch_tokens: int = 4096
    batch_timeout_s: float = 60.0  # a batch running longer is taken as a hung worker
    start_timeout_s: float = 600.0
    fault_injection: bool = False
    max_loaded: int = 0  # models a worker keeps loaded (0: all, from the start)
    shortlist: bool = True  # decode over a model's vocabulary shortlist when it has one (CPU)
    on_busy: Any = None  # callable(worker index, seconds) after every batch
    workers: list[Worker] = field(init=False)

    def __post_init__(self):
        self.workers = [Worker(i, d) for i, d in enumerate(self.devices)]
        self._idle: asyncio.Queue[Worker] = asyncio.Queue()
        # one thread per worker blocks on its pipe, so the event loop never does
        self._io = ThreadPoolExecutor(max_workers=len(self.workers), thread_name_prefix="nmt-worker-pipe")
        self._context = multiprocessing.get_context("spawn")
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False

    def start(self) -> None:
        """Spawn every worker; returns at once (`status()` reports loading)."""
        for w in self.workers:
            self._background(self._boot(w))

    def _background(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _boot(self, w: Worker) -> None:
        """Start (or restart) a worker's process, retrying with backoff while loading fails."""
        delay = 1.0
        while not self._stopping:
            w.state = "starting" if w.state in ("stopped", "starting") else "restarting"
            try:
                reply = await self._spawn(w)
            except Exception as e:  # e.g. spawn refused: never leave the worker "starting" silently
                reply = ("failed", f"could not start: {type(e).__name__}: {e}")
            if reply[0] == "ready":
                w.state, w.reason = "idle", ""
                features = reply[2]
                w.cpu_kernels, w.fused, w.int8_path = features["cpu_kernels"], features["fused"], features["int8_path"]
                w.dtype, w.loaded = features["dtype"], features.get("loaded", [])
                self._idle.put_nowait(w)
                return
            self._kill(w)
            w.state, w.reason = "failed", reply[1]
            log.error("worker %d: %s; retrying in %.0f s", w.index, w.reason, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def _spawn(self, w: Worker):
        """Start w's process; returns its first message: ("ready", pid, features) or ("failed", why)."""
        parent, child = self._context.Pipe()
        w.conn = parent
        w.process = self._context.Process(
            target=_worker_entry, name=f"nmt-worker-{w.index}", daemon=True,
            args=(child, self.models, w.device, self.dtype, self.threads, self.batch_tokens, self.fault_injection,
                  self.max_loaded, self.shortlist))
        w.process.start()
        child.close()  # so that recv sees EOF when the process dies
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._io, receive_message, parent), self.start_timeout_s)
        except TimeoutError:
            return "failed", f"did not load within {self.start_timeout_s:.0f} s"
        except (EOFError, OSError):
            await loop.run_in_executor(None, w.process.join, 5)
            return "failed", f"exited while loading (exit code {w.process.exitcode})"

    def _kill(self, w: Worker) -> None:
        if w.process is not None and w.process.pid is not None and w.process.is_alive():
            w.process.kill()
            w.process.join(5)
        if w.conn is not None:
            w.conn.close()

    async def run(self, key: BatchKey, sources: list[list[int]], weights: list[bool]) -> list:
        """Decode one batch on the next idle worker (waiting for one while all are busy): each
        source's hypotheses (model/pipeline.Decoded), with attention weights where `weights` says."""
        w = await self._idle.get()
        w.state = "busy"
        start = time.monotonic()
        call = asyncio.get_running_loop().run_in_executor(self._io, w.roundtrip, (key, sources, weights))
        call.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if abandoned
        try:
            reply = await asyncio.wait_for(asyncio.shield(call), self.batch_timeout_s)
        except (TimeoutError, EOFError, OSError) as e:
            hung = isinstance(e, asyncio.TimeoutError)
            if not hung:  # it is dying: let it, to report its own exit code
                await asyncio.get_running_loop().run_in_executor(None, w.process.join, 2)
            self._kill(w)  # a hung worker must go; the pipe thread then sees EOF
            reason = (f"hung for {self.batch_timeout_s:.0f} s and was killed" if hung
                      else f"exited (exit code {w.process.exitcode})")
            raise self._replace(w, reason) from e
        finally:
            w.busy_seconds += time.monotonic() - start
            w.batches += 1
            if self.on_busy:
                self.on_busy(w.index, time.monotonic() - start)
        if reply[0] == "fatal":
            self._kill(w)
            raise self._replace(w, f"failed beyond repair: {reply[1]}")
        w.state = "idle"
        self._idle.put_nowait(w)
        if reply[0] == "error":
            raise WorkerError(f"worker {w.index}: {reply[1]}")
        w.loaded = reply[2]
        return reply[1]

    def _replace(self, w: Worker, reason: str) -> WorkerError:
        """Start a new process for w; the error to fail its batch with."""
        w.restarts += 1
        w.state, w.reason = "restarting", f"worker {w.index} {reason}"
        log.error("%s; restarting it", w.reason)
        self._background(self._boot(w))
        return WorkerError(w.reason)

    def status(self) -> tuple[bool, str]:
        """(all workers alive, why not)."""
        down = [w for w in self.workers if not w.alive]
        reasons = [f"worker {w.index} ({w.device}) {w.state}" + (f": {w.reason}" if w.reason else "")
                   for w in down]
        return not down, "; ".join(reasons)

    async def stop(self, timeout: float = 10.0) -> None:
        """Tell idle workers to exit; kill any still running after timeout (the scheduler has
        drained by now, so only a batch past its shutdown deadline is cut off)."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        started = [w for w in self.workers if w.process is not None and w.process.pid is not None]
        for w in started:
            if w.state == "idle":
                with contextlib.suppress(OSError):
                    send_message(w.conn, None)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.process.join, timeout) for w in started))
        for w in started:
            self._kill(w)
            w.state = "stopped"
        self._io.shutdown(wait=False, cancel_futures=True)
