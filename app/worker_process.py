"""The worker process: loads every model on its device, then decodes jobs from its socket until
told to stop (the server side: app/worker.py). Only this process imports torch.

A job comes as ("job", job id, BatchKey, token ids, weights): the server prepared the texts
(model/pipeline.py). Its hypotheses go back as model/pipeline.Decoded, attention as numpy
arrays, so the server unpickles them without torch and finishes the texts itself. Two ways:

- batch by batch: the job is decoded as a whole (`Translator.decode_all`) and answered in one
  reply, ("ok", job id, hypotheses per source, models held);
- running batches (`running=True`; model/running.py): the job's sentences join running batches
  at step boundaries, jobs keep arriving while they run, and each sentence is answered when it
  is done, the sentences of one step together ("items", [(job id, index, hypotheses), ...]);
  ("cancel", job id) drops what is left of a job nobody waits for any more, answered
  ("cancelled", job id, sentences dropped). Options a running batch cannot take go batch by
  batch.

A failure answers ("error", job id, why), or ("fatal", job id, why) before the process exits.
"""

from __future__ import annotations

import os
import signal
import time
from collections import OrderedDict

import torch

from app.pipe import FAULT_EXIT, FAULT_RAISE, FAULT_SLOW, FAULT_SLOW_S, receive, send, waiting
from model.running import RunningBatches
from model.translator import Translator


def _inject_faults(translator, sources: list[list[int]]) -> None:
    for ids in sources:
        text = "".join(translator.tokenizer.source_pieces(ids))
        if FAULT_RAISE in text:
            raise RuntimeError("injected fault")
        if FAULT_EXIT in text:
            os._exit(3)
        if FAULT_SLOW in text:
            time.sleep(FAULT_SLOW_S)


class Translators:
    """A worker's translators: every model loaded at start, or with `max_loaded` (> 0) the first at
    start and each other on first use, at most `max_loaded` kept (the least recently used goes)."""

    def __init__(self, models: dict[str, str], device: str, dtype: str, max_loaded: int = 0, shortlist: bool = True,
                 pipelined_steps: bool = False):
        self.models, self.device, self.dtype, self.max_loaded = models, device, dtype, max_loaded
        self.shortlist, self.pipelined_steps = shortlist, pipelined_steps
        self.loaded: OrderedDict[str, Translator] = OrderedDict()
        for model_id in list(models)[: max_loaded or len(models)]:
            self.get(model_id)

    def get(self, model_id: str) -> Translator:
        if model_id in self.loaded:
            self.loaded.move_to_end(model_id)
            return self.loaded[model_id]
        while self.max_loaded and len(self.loaded) >= self.max_loaded:
            self.loaded.popitem(last=False)
        translator = self.loaded[model_id] = Translator.load(self.models[model_id], device=self.device,
                                                             dtype=self.dtype, shortlist=self.shortlist,
                                                             pipelined_steps=self.pipelined_steps)
        return translator


def worker_main(sock, models: dict[str, str], device: str, dtype: str, threads: int, batch_tokens: int,
                fault_injection: bool, max_loaded: int = 0, shortlist: bool = True, running: bool = False,
                running_slots: int = 64, running_join: tuple[int, int] = (1, 0), running_bytes: int = 0,
                pipelined_steps: bool = False, nice: int = 0) -> None:
    """Process entry point: load the models (all, or the first max_loaded), then decode jobs until
    told to stop; every "ok" reply says which models it holds. running: step-level batching, at
    most running_slots sentences in a running batch, joining it in groups as running_join says
    (RunningBatches' join_group, join_wait), the batches' buffers within running_bytes (0:
    RunningBatches' default). nice: niceness added to the server's, so that decoding yields the CPU
    to the HTTP processes whenever they have work."""
    # Ctrl-C reaches the whole process group; the server decides when workers stop, after
    # finishing in-flight work.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    os.nice(nice)  # lowering one's own priority needs no privilege
    try:
        held = Translators(models, device, dtype, max_loaded, shortlist, pipelined_steps)
        translators = held.loaded
    except Exception as e:
        send(sock, ("failed", f"loading models failed: {type(e).__name__}: {e}"))
        return
    features = {"dtype": next(iter(translators.values())).dtype,
                "cpu_kernels": any(t.cpu_kernels for t in translators.values()),
                "fused": any(t.fused for t in translators.values()),
                "int8_path": next((t.int8_path for t in translators.values() if t.int8_path), None),
                "loaded": list(translators)}
    send(sock, ("ready", os.getpid(), features))
    runners: dict[str, RunningBatches] = {}  # model id -> its running batches

    def failed(job_id, e: Exception) -> None:
        # A CUDA error other than OOM (a device-side assert) poisons the context for good:
        # only a new process recovers, so say so and exit.
        fatal = device.startswith("cuda") and "CUDA error" in str(e)
        if device.startswith("cuda") and not fatal:  # after an OOM, give the next batch the memory back
            for each in held.loaded.values():
                each.release_memory()
            torch.cuda.empty_cache()
        send(sock, ("fatal" if fatal else "error", job_id, f"{type(e).__name__}: {e}"))
        if fatal:
            os._exit(1)

    def take(message) -> None:
        if message[0] == "cancel":
            job_id, dropped = message[1], 0
            for batches in runners.values():
                tags = ({tag for tag in batches.sentences if tag[0] == job_id}
                        | {s.tag for queue in batches.waiting.values() for s in queue if s.tag[0] == job_id})
                batches.cancel(tags)
                dropped += len(tags)
            send(sock, ("cancelled", job_id, dropped))
            return
        _, job_id, key, sources, weights = message
        try:
            translator = held.get(key.model)  # loaded now if it is not (the job's time counts it)
            if fault_injection:
                _inject_faults(translator, sources)
            if running and RunningBatches.takes(key.options):
                batches = runners.get(key.model)
                if batches is None or (batches.translator is not translator and not batches.busy):
                    batches = runners[key.model] = RunningBatches(translator, running_slots,  # (re)loaded
                                                                  join_group=running_join[0], join_wait=running_join[1],
                                                                  max_bytes=running_bytes or None)
                for i, (ids, w) in enumerate(zip(sources, weights)):
                    batches.add((job_id, i), ids, key.options, w)
                return
            results = translator.decode_all(sources, key.options, weights, batch_tokens)
        except Exception as e:
            failed(job_id, e)
        else:
            send(sock, ("ok", job_id, results, list(held.loaded)))

    while True:
        busy = any(batches.busy for batches in runners.values())
        while not busy or waiting(sock):  # every job waiting; when nothing runs, wait for one
            try:
                message = receive(sock)
            except (EOFError, ConnectionError):  # the server is gone
                message = None
            if message is None:
                # nothing to flush or save; skipping interpreter teardown (~0.5 s with torch) makes
                # shutdown and restarts quicker
                os._exit(0)
            take(message)
            busy = any(batches.busy for batches in runners.values())
        done, failures = [], {}
        for batches in runners.values():
            for (job_id, index), hypotheses in batches.step():
                if not isinstance(hypotheses, Exception):
                    done.append((job_id, index, hypotheses))
                else:
                    failures.setdefault(job_id, hypotheses)  # one answer per job: its first failure
        if done:  # the step's finished sentences in one message: the server wakes once for all
            send(sock, ("items", done))
        for job_id, error in failures.items():
            failed(job_id, error)
