"""The worker process: loads every model on its device, then decodes batches from its pipe
until told to stop (the server side: app/worker.py). Only this process imports torch.

A batch comes as token ids and decoding options (the server prepared the texts:
model/pipeline.py); its hypotheses go back as model/pipeline.Decoded, attention as numpy arrays,
so the server unpickles them without torch and finishes the texts itself.
"""

from __future__ import annotations

import os
import signal
import time
from collections import OrderedDict

import torch

from app.pipe import FAULT_EXIT, FAULT_RAISE, FAULT_SLOW, FAULT_SLOW_S, receive_message, send_message
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

    def __init__(self, models: dict[str, str], device: str, dtype: str, max_loaded: int = 0, shortlist: bool = True):
        self.models, self.device, self.dtype, self.max_loaded = models, device, dtype, max_loaded
        self.shortlist = shortlist
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
                                                             dtype=self.dtype, shortlist=self.shortlist)
        return translator


def worker_main(conn, models: dict[str, str], device: str, dtype: str, threads: int, batch_tokens: int,
                fault_injection: bool, max_loaded: int = 0, shortlist: bool = True) -> None:
    """Process entry point: load the models (all, or the first max_loaded), then translate
    batches until told to stop; every reply says which models it holds."""
    # Ctrl-C reaches the whole process group; the server decides when workers stop, after
    # finishing in-flight work.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    try:
        held = Translators(models, device, dtype, max_loaded, shortlist)
        translators = held.loaded
    except Exception as e:
        send_message(conn, ("failed", f"loading models failed: {type(e).__name__}: {e}"))
        return
    features = {"dtype": next(iter(translators.values())).dtype,
                "cpu_kernels": any(t.cpu_kernels for t in translators.values()),
                "fused": any(t.fused for t in translators.values()),
                "int8_path": next((t.int8_path for t in translators.values() if t.int8_path), None),
                "loaded": list(translators)}
    send_message(conn, ("ready", os.getpid(), features))
    while True:
        try:
            message = receive_message(conn)
        except EOFError:  # the server is gone
            message = None
        if message is None:
            # nothing to flush or save; skipping interpreter teardown (~0.5 s with torch) makes
            # shutdown and restarts quicker
            os._exit(0)
        key, sources, weights = message
        try:
            translator = held.get(key.model)  # loaded now if it is not (the batch's time counts it)
            if fault_injection:
                _inject_faults(translator, sources)
            results = translator.decode_all(sources, key.options, weights, batch_tokens)
        except Exception as e:
            # A CUDA error other than OOM (a device-side assert) poisons the context for good:
            # only a new process recovers, so say so and exit.
            fatal = device.startswith("cuda") and "CUDA error" in str(e)
            if device.startswith("cuda") and not fatal:  # after an OOM, give the next batch the memory back
                for each in held.loaded.values():
                    each.release_memory()
                torch.cuda.empty_cache()
            send_message(conn, ("fatal" if fatal else "error", f"{type(e).__name__}: {e}"))
            if fatal:
                os._exit(1)
        else:
            send_message(conn, ("ok", results, list(held.loaded)))
