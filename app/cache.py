"""Sources decoded once: the same source tokens, with the same model (its weights' hash), compute
type and decoding options, get the stored hypotheses (model/pipeline.Decoded) instead of a second
decode. Software catalogs repeat strings endlessly and Weblate asks again and again.

Hypotheses are cached with the attention weights the text pipeline reads when it reads them
(a key of their own), never with the attention itself: calls that ask for attention or
alignments are never served from it (nor stored). It lives in the service's storage (app/storage.py) under
"cache:<sha256 of everything that decides the output>", for NMT_CACHE_TTL_S, within
NMT_CACHE_BYTES in this process (the least recently used go first), or in Redis, where every
replica finds it. NMT_CACHE=false turns it off; /metrics counts hits and misses.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import asdict

import numpy as np
import orjson

from app.scheduler import BatchKey
from app.storage import Storage
from model.pipeline import Decoded


def to_bytes(hypotheses: list[Decoded]) -> bytes:
    # scores as float.hex: exact, and -inf (an underflowed fp16 hypothesis) has no JSON number
    return orjson.dumps([{"token_ids": h.token_ids, "score": float(h.score).hex(), "log_prob": float(h.log_prob).hex(),
                          "ended_with_eos": h.ended_with_eos, "weights": _array(h.weights)} for h in hypotheses])


def from_bytes(data: bytes) -> list[Decoded]:
    return [Decoded(h["token_ids"], float.fromhex(h["score"]), float.fromhex(h["log_prob"]), h["ended_with_eos"],
                    _from_array(h["weights"])) for h in orjson.loads(data)]


def _array(a: np.ndarray | None) -> list | None:
    """A float32 array as [shape, base64 of its bytes]: exactly the values, a quarter of JSON numbers' size."""
    return None if a is None else [list(a.shape), base64.b64encode(np.ascontiguousarray(a, np.float32)).decode()]


def _from_array(stored: list | None) -> np.ndarray | None:
    if stored is None:
        return None
    shape, data = stored
    return np.frombuffer(base64.b64decode(data), dtype=np.float32).reshape(shape)


@functools.lru_cache(maxsize=1024)
def _fields(batch: BatchKey) -> dict:
    """The batch key's every field (~8 us each time by `asdict`; a service sees few distinct keys)."""
    return asdict(batch)


class TranslationCache:
    def __init__(self, storage: Storage, ttl_s: float, fingerprints: dict[str, str]):
        self.storage, self.ttl_s, self.fingerprints = storage, ttl_s, fingerprints  # model id -> weights' hash

    def key(self, batch: BatchKey, dtype: str, source: list[int], partition: str = "", weights: bool = False) -> str:
        """`partition`: whose translations these are (NMT_CACHE_SCOPE); one partition never sees another's.
        Every field of the batch key counts, by construction: an option added there can never be
        served another option's cached translation. `weights`: hypotheses with attention weights."""
        decided_by = [self.fingerprints[batch.model], dtype, _fields(batch), source, partition, weights]
        return "cache:" + hashlib.sha256(orjson.dumps(decided_by)).hexdigest()

    async def get(self, keys: list[str]) -> list[list[Decoded] | None]:
        found = await self.storage.get_many(keys)
        return [None if data is None else from_bytes(data) for data in found]

    async def put(self, keys: list[str], results: list[list[Decoded]]) -> None:
        await self.storage.put_many({key: to_bytes(result) for key, result in zip(keys, results)}, self.ttl_s)
