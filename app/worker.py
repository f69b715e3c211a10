"""Model workers: one process per model replica; each owns its device and a copy of every model.

Why processes, for CPU and CUDA alike (one mechanism): torch's intra-op thread count is per
process, so CPU replicas with their own thread count (on 2 cores, 2 workers x 1 thread can beat
1 x 2) must be processes; on CUDA a process per GPU keeps device work out of the server process,
and a crash (segfault, OOM kill, CUDA error) takes down one replica, which is restarted, not the
server. Processes are spawned (fork is unsafe with CUDA and with torch's thread pools).

The process itself is app/worker_process.py, the only place torch is imported. Each worker
talks to the server over a socket pair (app/pipe.py), whose server end the event loop reads and
writes itself: a worker's answer wakes the request it completes without a thread in between. The
server side, WorkerPool, turns a worker's exception into an error for that job only; a worker that
dies or hangs is replaced, and `status()` says so meanwhile. Two ways to use a worker:

- batch by batch (the CPU default): each job goes to an idle worker, which decodes it whole and
  answers it; the worker is the job's alone meanwhile;
- running batches (`running=True`, the CUDA default; model/running.py): jobs go to the worker
  with the fewest sentences in flight while it runs others, their sentences join its running
  batches at step boundaries, and each sentence is answered (`deliver`) as soon as it is done.
  A task per worker reads its answers. A job cancelled here (its requests gone) is cancelled in
  the worker too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.pipe import read_message, write_message
from app.scheduler import BatchKey

log = logging.getLogger("uvicorn.error")


class WorkerError(Exception):
    """The batch failed in a worker (it raised, died or hung); only that batch's requests fail."""


def _worker_entry(*args) -> None:
    """A worker process's entry point. torch is imported here, in the worker, never in the server."""
    from app.worker_process import worker_main

    worker_main(*args)


@dataclass
class _Job:
    """A job in flight on a worker with running batches: answered sentence by sentence."""

    results: list[Any]
    remaining: int
    deliver: Callable[[int, Any], None] | None  # (index, hypotheses) as each sentence is done
    future: asyncio.Future

    def answer(self, index: int, hypotheses: Any) -> None:
        if self.future.done() or self.results[index] is not None:
            return
        self.results[index] = hypotheses
        self.remaining -= 1
        if self.deliver is not None:
            self.deliver(index, hypotheses)
        if not self.remaining:
            self.future.set_result(self.results)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


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
    reader: asyncio.StreamReader | None = None  # the server's end of its socket (a new one each start)
    writer: asyncio.StreamWriter | None = None
    busy_seconds: float = 0.0
    batches: int = 0
    jobs: dict[int, _Job] = field(default_factory=dict)  # running batches: the jobs in flight, by id
    cancelled: int = 0  # running batches: sentences it dropped unfinished
    busy_since: float = 0.0  # running batches: since when it has had jobs in flight

    @property
    def sentences(self) -> int:
        """Running batches: the sentences in flight, not answered yet."""
        return sum(job.remaining for job in self.jobs.values())

    @property
    def alive(self) -> bool:
        return self.state in ("idle", "busy")


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
    pipelined_steps: bool = False  # on a GPU, the graphed search queues a step before it waits for the one before
    running: bool = False  # step-level batching in the workers (model/running.py)
    running_slots: int = 64  # sentences in one running batch
    running_join: tuple[int, int] = (1, 0)  # sentences join a running batch in groups: (group, steps waited at most)
    running_bytes: int = 0  # the running batches' buffers together (0: model/running.py's default)
    nice: int = 0  # niceness the workers add to the server's (lower CPU priority)
    on_busy: Any = None  # callable(worker index, seconds) after every batch, or busy spell with running batches
    workers: list[Worker] = field(init=False)

    def __post_init__(self):
        self.workers = [Worker(i, d) for i, d in enumerate(self.devices)]
        self._idle: asyncio.Queue[Worker] = asyncio.Queue()
        self._context = multiprocessing.get_context("spawn")
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._job_ids = itertools.count()
        self._ready = asyncio.Event()  # set whenever a worker (re)starts

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
                if self.running:
                    self._background(self._read(w, w.reader, w.writer))
                else:
                    self._idle.put_nowait(w)
                self._ready.set()
                return
            self._kill(w)
            w.state, w.reason = "failed", reply[1]
            log.error("worker %d: %s; retrying in %.0f s", w.index, w.reason, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def _spawn(self, w: Worker):
        """Start w's process; returns its first message: ("ready", pid, features) or ("failed", why)."""
        parent, child = socket.socketpair()
        w.reader, w.writer = await asyncio.open_unix_connection(sock=parent)
        w.process = self._context.Process(
            target=_worker_entry, name=f"nmt-worker-{w.index}", daemon=True,
            args=(child, self.models, w.device, self.dtype, self.threads, self.batch_tokens, self.fault_injection,
                  self.max_loaded, self.shortlist, self.running, self.running_slots, self.running_join,
                  self.running_bytes, self.pipelined_steps, self.nice))
        try:
            w.process.start()
        finally:
            child.close()  # the worker's copy is its own: ours closed, a read sees EOF when the process dies
        try:
            return await asyncio.wait_for(read_message(w.reader), self.start_timeout_s)
        except TimeoutError:
            return "failed", f"did not load within {self.start_timeout_s:.0f} s"
        except (EOFError, OSError):
            await asyncio.get_running_loop().run_in_executor(None, w.process.join, 5)
            return "failed", f"exited while loading (exit code {w.process.exitcode})"

    def _kill(self, w: Worker) -> None:
        if w.process is not None and w.process.pid is not None and w.process.is_alive():
            w.process.kill()
            w.process.join(5)
        if w.writer is not None:
            w.writer.transport.abort()  # what it had not sent yet is for a process that is gone

    async def run(self, key: BatchKey, sources: list[list[int]], weights: list[bool],
                  deliver: Callable[[int, Any], None] | None = None) -> list:
        """Decode one job: each source's hypotheses (model/pipeline.Decoded), with attention weights
        where `weights` says. With running batches `deliver(index, hypotheses)` hears of each
        source as soon as it is done; batch by batch, the job waits for an idle worker."""
        if self.running:
            return await self._run_running(key, sources, weights, deliver)
        w = await self._idle.get()
        w.state = "busy"
        start = time.monotonic()
        job_id = next(self._job_ids)
        write_message(w.writer, ("job", job_id, key, sources, weights))
        answer = asyncio.ensure_future(read_message(w.reader))  # read whole even if this call is cancelled
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if abandoned
        try:
            reply = await asyncio.wait_for(asyncio.shield(answer), self.batch_timeout_s)
        except (TimeoutError, EOFError, OSError) as e:
            hung = isinstance(e, asyncio.TimeoutError)
            if not hung:  # it is dying: let it, to report its own exit code
                await asyncio.get_running_loop().run_in_executor(None, w.process.join, 2)
            self._kill(w)  # a hung worker must go
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
            raise self._replace(w, f"failed beyond repair: {reply[2]}")
        w.state = "idle"
        self._idle.put_nowait(w)
        if reply[0] == "error":
            raise WorkerError(f"worker {w.index}: {reply[2]}")
        w.loaded = reply[3]
        return reply[2]

    async def _run_running(self, key: BatchKey, sources: list[list[int]], weights: list[bool],
                           deliver: Callable[[int, Any], None] | None) -> list:
        """A job to the alive worker with the fewest sentences in flight, answered as its reader
        thread hears (`_answer`)."""
        loop = asyncio.get_running_loop()
        while not (alive := [w for w in self.workers if w.alive]):
            self._ready.clear()
            await self._ready.wait()
        w = min(alive, key=lambda w: (w.sentences, w.batches))  # among equals, the one given fewer jobs
        job_id = next(self._job_ids)
        job = _Job([None] * len(sources), len(sources), deliver, loop.create_future())
        if not w.jobs:
            w.state, w.busy_since = "busy", time.monotonic()
        w.jobs[job_id] = job
        w.batches += 1
        acknowledged = False  # a cancelled job stays in flight until the worker says it dropped it
        try:
            write_message(w.writer, ("job", job_id, key, sources, weights))
            await w.writer.drain()  # a worker busy stepping reads it between steps
            return await asyncio.wait_for(asyncio.shield(job.future), self.batch_timeout_s)
        except asyncio.CancelledError:  # nobody waits for it (the scheduler cancels): the worker drops it
            if w.alive and not job.future.done():
                job.deliver, acknowledged = None, True
                write_message(w.writer, ("cancel", job_id))
            raise
        except TimeoutError:
            if w.jobs.get(job_id) is job and w.alive:  # it has not answered for batch_timeout_s: hung
                self._kill(w)
                raise self._fail_all(w, f"hung for {self.batch_timeout_s:.0f} s and was killed") from None
            raise
        except (EOFError, OSError) as e:  # the socket broke: its reader tells the rest
            raise WorkerError(f"worker {w.index} is gone: {type(e).__name__}") from e
        finally:
            if not acknowledged:
                self._forget(w, job_id)

    def _forget(self, w: Worker, job_id: int) -> None:
        if w.jobs.pop(job_id, None) is not None and not w.jobs and w.alive:
            w.state = "idle"
            spell = time.monotonic() - w.busy_since
            w.busy_seconds += spell
            if self.on_busy:
                self.on_busy(w.index, spell)

    async def _read(self, w: Worker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A worker's reader (running batches): its answers, until its socket closes."""
        while True:
            try:
                reply = await read_message(reader)
            except (EOFError, OSError):
                self._gone(w, writer)
                return
            try:
                self._answer(w, writer, reply)
            except Exception:  # one job's fault (its deliver callback): never the end of reading the others'
                log.exception("worker %d: handling its answer failed", w.index)

    def _answer(self, w: Worker, writer: asyncio.StreamWriter, reply) -> None:
        if writer is not w.writer:  # a worker since replaced
            return
        if reply[0] == "items":  # the sentences a running step finished, of any jobs
            for job_id, index, hypotheses in reply[1]:
                if (job := w.jobs.get(job_id)) is not None:  # (else given up meanwhile)
                    job.answer(index, hypotheses)
            return
        kind, job_id = reply[0], reply[1]
        if kind == "fatal":
            self._kill(w)
            self._fail_all(w, f"failed beyond repair: {reply[2]}")
            return
        job = w.jobs.get(job_id)
        if job is None:  # given up meanwhile (timed out)
            return
        if kind == "cancelled":
            w.cancelled += reply[2]
            self._forget(w, job_id)
        elif kind == "ok":
            w.loaded = reply[3]
            for index, hypotheses in enumerate(reply[2]):
                job.answer(index, hypotheses)
        else:
            job.fail(WorkerError(f"worker {w.index}: {reply[2]}"))

    def _gone(self, w: Worker, writer: asyncio.StreamWriter) -> None:
        """A worker's socket closed under it (running batches): it died; its jobs fail, it is replaced."""
        if writer is not w.writer or not w.alive or self._stopping:
            return
        w.state = "restarting"  # no new jobs for it

        async def bury() -> None:  # let it exit, to report its own exit code
            await asyncio.get_running_loop().run_in_executor(None, w.process.join, 2)
            self._kill(w)
            self._fail_all(w, f"exited (exit code {w.process.exitcode})")

        self._background(bury())

    def _fail_all(self, w: Worker, reason: str) -> WorkerError:
        """A worker that must go (killed already): replaced, and every job in flight on it failed."""
        error = self._replace(w, reason)
        jobs, w.jobs = list(w.jobs.values()), {}
        for job in jobs:
            job.fail(error)
        return error

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
                write_message(w.writer, None)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.process.join, timeout) for w in started))
        for w in started:
            self._kill(w)
            w.state = "stopped"
