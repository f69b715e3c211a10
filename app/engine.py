"""The engine: the scheduler and its workers, which decode prepared jobs (token ids) into hypotheses.

The HTTP side (app/service.py) prepares texts, submits their ids as one Job, and finishes the texts
when the hypotheses come back. Where the engine lives is the operator's choice (NMT_HTTP_PROCESSES):

- one HTTP process (the default): `Engine` in that process, called directly;
- several HTTP processes in front of one engine (`nmt serve`, app/serve.py): the engine runs in a
  process of its own (`engine_main`) and each HTTP process talks to it through `RemoteEngine`, over
  a Unix socket in a directory only this user can enter. One GPU worker then batches the requests of
  every HTTP process, while their HTTP and text work (~1 ms of CPU a request) spreads over as many
  cores. Both ends are ours: messages are framed pickles, as on the worker sockets (app/pipe.py).

Over the socket the HTTP process sends ("submit", number, key, sources, weights, client) and ("cancel",
number); the engine answers ("done", number, results, started, finished) or ("failed", number,
error class, message), and sends ("status", EngineStatus) when it connects and whenever its status
changes. The engine process also holds the language detector (app/language.py), one copy for
every HTTP process: ("detect", number, texts) is answered ("detected", number, each text's
languages) or ("failed", number, ...). Without Redis it holds the store too (app/storage.py), where
one HTTP process keeps what another serves (alignments, translated files, rate-limit counts):
("store", number, operation, arguments) runs that MemoryStorage method and is answered ("stored",
number, its result) or ("failed", number, ...). Times are time.monotonic(), one clock for every
process of the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import glob
import itertools
import logging
import os
import signal
from dataclasses import dataclass, fields

from app.language import DetectionUnavailable, LanguageDetector
from app.metrics import Metrics
from app.pipe import read_message, write_message
from app.scheduler import BatchKey, Job, QueueFull, Scheduler, ShuttingDown
from app.settings import Settings
from app.storage import MemoryStorage, RemoteStorage, StorageUnavailable, open_storage
from app.worker import Worker, WorkerError, WorkerPool

log = logging.getLogger("uvicorn.error")

# jobs in flight on a worker with running batches: enough that one job's long sentence does not
# keep the next requests from its free slots
RUNNING_JOBS_PER_WORKER = 8
STATUS_INTERVAL_S = 0.2  # how often the engine process looks whether its status changed
STORE_TIMEOUT_S = 5.0  # longest an HTTP process waits for the engine process's store
ERRORS = {cls.__name__: cls for cls in (QueueFull, ShuttingDown, WorkerError)}  # what a failed job can raise


def visible_cuda_devices() -> int:
    """How many CUDA devices a worker will see, without torch (the server never imports it): the
    entries of CUDA_VISIBLE_DEVICES when it is set, else the NVIDIA device files."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [d for d in visible.split(",") if d.strip()]
        return 0 if not entries or entries[0].strip().startswith("-") else len(entries)
    return len(glob.glob("/dev/nvidia[0-9]*"))


@dataclass(frozen=True)
class WorkerState:
    """What /ready and /v1/models show of one worker."""

    index: int
    device: str
    state: str
    reason: str
    restarts: int
    batches: int
    busy_seconds: float
    cancelled: int
    cpu_kernels: bool
    fused: bool
    int8_path: str | None
    dtype: str | None
    loaded: tuple[str, ...]

    @property
    def alive(self) -> bool:
        return self.state in ("idle", "busy")

    @classmethod
    def of(cls, w: Worker) -> WorkerState:
        values = {f.name: getattr(w, f.name) for f in fields(cls)}
        return cls(**{**values, "busy_seconds": round(w.busy_seconds, 3), "loaded": tuple(w.loaded)})


@dataclass(frozen=True)
class EngineStatus:
    ready: bool
    reason: str
    device_kind: str  # 'cpu' or 'cuda'
    dtype: str  # the compute type the workers resolved (NMT_DTYPE, "auto" made concrete once one is up)
    workers: tuple[WorkerState, ...]


class Engine:
    """The scheduler and the worker pool, as NMT_* settings lay them out, for the models given
    (model id -> checkpoint directory). Its batches and workers show in `metrics`."""

    def __init__(self, settings: Settings, models: dict[str, str], metrics: Metrics):
        s = self.settings = settings
        cuda = visible_cuda_devices() if s.device != "cpu" else 0
        self.device_kind, devices, self.threads = s.worker_layout(cuda)
        batch_tokens = s.batch_token_budget(self.device_kind)
        running = s.runs_batches()
        self.pool = WorkerPool(
            models, devices, threads=self.threads, dtype=s.dtype, batch_tokens=batch_tokens,
            batch_timeout_s=s.request_timeout_s + 30, start_timeout_s=s.worker_start_timeout_s,
            fault_injection=s.fault_injection, max_loaded=s.max_loaded_models, shortlist=s.shortlist, running=running,
            running_slots=s.running_slots, running_join=(s.running_join_group, s.running_join_wait),
            running_bytes=s.running_bytes, pipelined_steps=s.pipelined_steps, nice=s.worker_niceness(self.device_kind),
            on_busy=lambda index, seconds: metrics.worker_busy.labels(str(index)).inc(seconds))
        # batch by batch: a job per worker at a time, items waiting max_wait for company; running
        # batches: jobs go at once, a few per worker in flight (the rest wait here, under the queue limit)
        slots, max_wait_s = (len(devices) * RUNNING_JOBS_PER_WORKER, 0.0) if running else (
            len(devices), s.batch_wait_s(self.device_kind))

        def observe_batch(key: BatchKey, items: int, tokens: int) -> None:
            metrics.batch_size.observe(items)
            metrics.batch_tokens.observe(tokens)

        self.scheduler = Scheduler(self.pool.run, slots=slots, batch_tokens=batch_tokens, max_wait_s=max_wait_s,
                                   max_queue_items=s.max_queue_items, on_batch=observe_batch, cancel_in_flight=running,
                                   share_among=1 if running else len(devices),
                                   long_job_items=0 if running else s.long_job_batch_items(self.device_kind),
                                   hold_s=0.0 if running else s.batch_hold_ms / 1000)
        metrics.engine_gauges(lambda: (self.scheduler.queued, self.scheduler.in_flight,
                                       sum(w.alive for w in self.pool.workers),
                                       sum(w.restarts for w in self.pool.workers)))

    async def start(self) -> None:
        """Spawn the workers (they load meanwhile: `status()` says so) and start scheduling."""
        self.pool.start()
        self.scheduler.start()

    async def stop(self) -> None:
        """Finish queued and in-flight work (within NMT_SHUTDOWN_TIMEOUT_S), then stop the workers."""
        await self.scheduler.stop(self.settings.shutdown_timeout_s)
        await self.pool.stop()

    def submit(self, key: BatchKey, sources: list[list[int]], weights: list[bool], client: str = "") -> Job:
        """Queue a job of `client`'s (app/scheduler.py); raises QueueFull or ShuttingDown."""
        return self.scheduler.submit(key, sources, weights, client)

    def cancel(self, job: Job) -> None:
        self.scheduler.cancel(job)

    @property
    def dtype(self) -> str:
        """The compute type the workers resolved (NMT_DTYPE, "auto" made concrete once one is up)."""
        return next((w.dtype for w in self.pool.workers if w.dtype), self.settings.dtype)

    def status(self) -> EngineStatus:
        ready, reason = self.pool.status()
        return EngineStatus(ready, reason, self.device_kind, self.dtype, tuple(WorkerState.of(w) for w in self.pool.workers))


# --- the engine in a process of its own, and the HTTP processes' end of its socket ---


class _Client:
    """One HTTP process, as the engine process sees it: its jobs in flight, by its numbers."""

    def __init__(self, engine: Engine, writer: asyncio.StreamWriter, detector: asyncio.Future | None = None,
                 storage: MemoryStorage | None = None):
        """detector: the language detector, loading (a future), or None: detection is off.
        storage: the HTTP processes' store, or None: they share Redis."""
        self.engine, self.writer, self.detector, self.storage = engine, writer, detector, storage
        self.jobs: dict[int, Job] = {}
        self.status: EngineStatus | None = None  # the last status sent
        self.asked: set[asyncio.Task] = set()  # language detections and store operations under way

    def send(self, message) -> None:
        if not self.writer.is_closing():
            write_message(self.writer, message)

    def send_status(self, status: EngineStatus) -> None:
        if status != self.status:
            self.status = status
            self.send(("status", status))

    def take(self, message) -> None:
        if message[0] == "cancel":
            job = self.jobs.pop(message[1], None)
            if job is not None:
                self.engine.cancel(job)
            return
        if message[0] in ("detect", "store"):  # (MemoryStorage never waits: store operations run in order)
            task = asyncio.create_task((self.detect if message[0] == "detect" else self.store)(*message[1:]))
            self.asked.add(task)
            task.add_done_callback(self.asked.discard)
            return
        _, number, key, sources, weights, client = message
        try:
            job = self.engine.submit(key, sources, weights, client)
        except (QueueFull, ShuttingDown) as e:
            self.send(("failed", number, type(e).__name__, str(e)))
            return
        self.jobs[number] = job
        job.future.add_done_callback(lambda future: self.answer(number, job))

    def answer(self, number: int, job: Job) -> None:
        if self.jobs.pop(number, None) is None or job.future.cancelled():  # cancelled by its HTTP process
            return
        error = job.future.exception()
        if error is None:
            self.send(("done", number, job.future.result(), job.started, job.finished))
        else:
            kind = type(error).__name__ if type(error).__name__ in ERRORS else WorkerError.__name__
            self.send(("failed", number, kind, str(error)))

    async def detect(self, number: int, texts: list[str]) -> None:
        """Each text's languages, all candidates (the HTTP process keeps as many as it needs), off
        the event loop: lingua holds the GIL ~2 ms a short text."""
        try:
            if self.detector is None:
                raise WorkerError("language detection is off in the engine process")
            detector = await self.detector  # (still loading, at start)
            found = await asyncio.to_thread(detector.detect_all, texts, None)
        except Exception as e:  # told to the HTTP process, which answers 503
            self.send(("failed", number, WorkerError.__name__, f"language detection failed: {type(e).__name__}: {e}"))
            return
        self.send(("detected", number, found))

    async def store(self, number: int, operation: str, arguments: tuple) -> None:
        """One operation on the store, answered with its result."""
        if self.storage is None or operation not in RemoteStorage.OPERATIONS:
            self.send(("failed", number, StorageUnavailable.__name__, f"the engine process keeps no store for "
                       f"'{operation}' (NMT_REDIS_URL is set, and is the store)"))
            return
        self.send(("stored", number, await getattr(self.storage, operation)(*arguments)))

    def gone(self) -> None:
        """Its HTTP process went away: nobody waits for its jobs."""
        jobs, self.jobs = list(self.jobs.values()), {}
        for job in jobs:
            self.engine.cancel(job)
        for task in list(self.asked):
            task.cancel()


async def run_engine(settings: Settings, socket_path: str, parent) -> None:
    """Serve the engine on socket_path until `parent` (its end of a pipe from `nmt serve`) says stop
    or closes; then finish queued and in-flight work, and stop."""
    from app.registry import Registry  # reads the checkpoints' headers and tokenizers, never torch

    registry = await asyncio.to_thread(Registry.load, settings.model_dirs, None, settings.model_cache)
    metrics = Metrics()
    engine = Engine(settings, {model_id: str(m.directory) for model_id, m in registry.models.items()}, metrics)
    storage = None if settings.redis_url else open_storage(settings)  # the HTTP processes' store, without Redis
    clients: dict[_Client, asyncio.Task] = {}
    detector = None  # the HTTP processes' one language detector, loading while the workers start
    if settings.detect_languages != ["none"]:
        detector = asyncio.ensure_future(asyncio.to_thread(
            LanguageDetector, settings.detect_languages, settings.detect_low_accuracy, settings.detect_preload))

    async def serve_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = _Client(engine, writer, detector, storage)
        clients[client] = asyncio.current_task()
        client.send_status(engine.status())
        try:
            while True:
                client.take(await read_message(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            clients.pop(client, None)
            client.gone()
            writer.close()

    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)  # a previous engine's
    server = await asyncio.start_unix_server(serve_client, path=socket_path)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(parent.fileno(), stopping.set)  # a message, or EOF: `nmt serve` is stopping, or gone
    await engine.start()
    gc.collect()
    gc.freeze()  # what it loaded lives as long as it does: out of the collector's walks (as app/main.py)
    log.info("engine: %s on %d %s worker(s) x %d thread(s), dtype %s, at %s", registry.pairs(),
             len(engine.pool.workers), engine.device_kind, engine.threads, settings.dtype, socket_path)
    while not stopping.is_set():
        status = with_detector(engine.status(), detector)
        for client in list(clients):
            client.send_status(status)
        metrics.update_engine_gauges()
        if storage is not None:
            metrics.update_store_gauges(storage)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), STATUS_INTERVAL_S)
    loop.remove_reader(parent.fileno())
    server.close()  # no new HTTP processes; those connected still get their answers
    await engine.stop()
    for client, task in list(clients.items()):
        client.writer.close()  # its reader sees the end, and its task ends
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(task, 1.0)


def with_detector(status: EngineStatus, detector: asyncio.Future | None) -> EngineStatus:
    """The engine's status, not ready while its language detector loads (/detect and 'auto' would
    wait) or after it failed to load (they would fail: the reason says why)."""
    if detector is None or (detector.done() and detector.exception() is None):
        return status
    reason = ("loading the language detector" if not detector.done()
              else f"the language detector failed to load: {detector.exception()}")
    return dataclasses.replace(status, ready=False, reason=reason)


def engine_main(settings: Settings, socket_path: str, parent) -> None:
    """The engine process's entry point (spawned by app/serve.py, which holds the other end of `parent`)."""
    # Ctrl-C, and SIGTERM sent to the whole group (timeout(1), systemd), reach every process; `nmt
    # serve` stops the engine once its HTTP processes have finished their requests, which need it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    asyncio.run(run_engine(settings, socket_path, parent))


class _RemoteJob(Job):
    def __init__(self, number: int, *args):
        super().__init__(*args)
        self.number = number  # its name on the socket


class RemoteEngine:
    """The engine of another process, as an HTTP process sees it: `Engine`'s interface, over its socket.
    While the socket is down (the engine restarting) jobs fail with WorkerError and `status()`
    says why; it reconnects by itself, unless `nmt serve`, its parent, is gone (killed outright):
    then nobody will start the engine again, and this process stops too (SIGTERM to itself),
    rather than hold the port answering 503."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self._parent = os.getppid()
        self._writer: asyncio.StreamWriter | None = None
        self._jobs: dict[int, Job] = {}  # in flight, by number
        # language detections and store operations asked, by number: each one's answer to come, and
        # the exception that says it failed
        self._asked: dict[int, tuple[asyncio.Future, type[Exception]]] = {}
        self._numbers = itertools.count()
        self._status = EngineStatus(False, "the engine process is not connected yet", "cpu", "", ())
        self._connected = asyncio.Event()  # set by the engine's first status on a connection
        self._task: asyncio.Task | None = None

    @property
    def device_kind(self) -> str:
        return self._status.device_kind

    @property
    def dtype(self) -> str:
        return self._status.dtype

    async def start(self, wait_s: float = 60.0) -> None:
        """Connect, and keep connected in the background. Waits up to wait_s for the engine process
        (it may still be starting), so that this HTTP process takes no requests it would refuse;
        past that it starts anyway, `status()` saying why it is not ready."""
        self._task = asyncio.create_task(self._keep_connected(), name="engine-connection")
        try:
            await asyncio.wait_for(self._connected.wait(), wait_s)
        except TimeoutError:
            log.warning("%s after %g s; serving meanwhile", self._status.reason, wait_s)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._drop_connection("this HTTP process is stopping")

    async def _keep_connected(self) -> None:
        delay = 0.05
        while True:
            try:
                reader, self._writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError as e:
                if os.getppid() != self._parent:
                    log.error("the engine process is gone, and `nmt serve` with it: stopping")
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                self._status = _unreachable(self._status, f"the engine process is unreachable ({e.strerror}); "
                                            "retrying")
                await asyncio.sleep(delay)
                delay = min(2 * delay, 1.0)
                continue
            delay = 0.05
            try:
                while True:
                    self._take(await read_message(reader))
            except (asyncio.IncompleteReadError, ConnectionError):
                log.error("the engine process closed its socket; reconnecting")
            self._drop_connection("the engine process went away")

    def _drop_connection(self, why: str) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._connected.clear()
        self._status = _unreachable(self._status, why)
        jobs, self._jobs = list(self._jobs.values()), {}
        for job in jobs:
            job.fail(WorkerError(f"{why} before this job was answered"))
        asked, self._asked = list(self._asked.values()), {}
        for future, error in asked:
            if not future.done():
                future.set_exception(error(f"{why} before it answered"))

    def _take(self, message) -> None:
        kind = message[0]
        if kind == "status":
            self._status = message[1]
            self._connected.set()
            return
        asked = self._asked.pop(message[1], None)
        if asked is not None:
            future, error = asked
            if future.done():  # given up here meanwhile
                return
            if kind in ("detected", "stored"):
                future.set_result(message[2])
            else:
                future.set_exception(error(message[3]))
            return
        job = self._jobs.pop(message[1], None)
        if job is None:  # cancelled here meanwhile
            return
        if kind == "done":
            _, _, results, job.started, job.finished = message
            if not job.done:
                job.future.set_result(results)
        else:
            job.fail(ERRORS[message[2]](message[3]))

    def submit(self, key: BatchKey, sources: list[list[int]], weights: list[bool], client: str = "") -> Job:
        if self._writer is None or not self._connected.is_set():
            raise WorkerError(self._status.reason or "the engine process is not connected")
        job = _RemoteJob(next(self._numbers), key, sources, weights)
        self._jobs[job.number] = job
        write_message(self._writer, ("submit", job.number, key, sources, weights, client))
        return job

    async def detect(self, texts: list[str]) -> list[list[tuple[str, float]]]:
        """The engine process's language detector on `texts` (app/language.py: RemoteDetector):
        each text's languages, best first, all of them."""
        return await self._ask(DetectionUnavailable, "detect", texts)

    async def store(self, operation: str, *arguments):
        """The engine process's store (app/storage.py: RemoteStorage): its `operation`'s result;
        StorageUnavailable when the engine process does not answer within STORE_TIMEOUT_S."""
        try:
            return await asyncio.wait_for(self._ask(StorageUnavailable, "store", operation, arguments),
                                          STORE_TIMEOUT_S)
        except TimeoutError:
            raise StorageUnavailable(f"the engine process did not answer within {STORE_TIMEOUT_S:g} s") from None

    async def _ask(self, error: type[Exception], kind: str, *arguments):
        """Send (kind, number, *arguments) and wait for its answer; `error` when it fails or the
        engine process is not connected."""
        if self._writer is None or not self._connected.is_set():
            raise error(self._status.reason or "the engine process is not connected")
        number = next(self._numbers)
        answer = asyncio.get_running_loop().create_future()
        self._asked[number] = (answer, error)
        write_message(self._writer, (kind, number, *arguments))
        try:
            return await answer
        finally:
            self._asked.pop(number, None)

    def cancel(self, job: _RemoteJob) -> None:
        job.future.cancel()
        if self._jobs.pop(job.number, None) is not None and self._writer is not None:
            write_message(self._writer, ("cancel", job.number))

    def status(self) -> EngineStatus:
        return self._status


def _unreachable(status: EngineStatus, reason: str) -> EngineStatus:
    """The status of an engine this process cannot reach: not ready, and why; its workers unknown."""
    return EngineStatus(False, reason, status.device_kind, status.dtype, ())
