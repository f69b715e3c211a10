"""Translations decoded once: the same source tokens, with the same model (its weights' hash),
compute type and decoding options, get the stored result instead of a second decode. Software
catalogs repeat strings endlessly and Weblate asks again and again.

A result is cached without attention, so calls that ask for attention or alignments are never
served from it (nor stored). It lives in the service's storage (app/storage.py) under
"cache:<sha256 of everything that decides the output>", for NMT_CACHE_TTL_S, within
NMT_CACHE_BYTES in this process (the least recently used go first), or in Redis, where every
replica finds it. NMT_CACHE=false turns it off; /metrics counts hits and misses.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

from app.scheduler import BatchKey
from app.storage import Storage
from model.results import Translation, TranslationResult

_FIELDS = ("text", "tokens", "token_ids", "score", "log_prob", "ended_with_eos", "spans_inserted", "spans_removed")


def to_bytes(result: TranslationResult) -> bytes:
    return json.dumps({"source_tokens": result.source_tokens,
                       "hypotheses": [{f: getattr(h, f) for f in _FIELDS} for h in result.hypotheses]}).encode()


def from_bytes(data: bytes) -> TranslationResult:
    fields = json.loads(data)
    return TranslationResult(fields["source_tokens"], [Translation(**h) for h in fields["hypotheses"]])


class TranslationCache:
    def __init__(self, storage: Storage, ttl_s: float, fingerprints: dict[str, str]):
        self.storage, self.ttl_s, self.fingerprints = storage, ttl_s, fingerprints  # model id -> weights' hash

    def key(self, batch: BatchKey, dtype: str, source: list[int], partition: str = "") -> str:
        """`partition`: whose translations these are (NMT_CACHE_SCOPE); one partition never sees another's.
        Every field of the batch key counts, by construction: an option added there can never be
        served another option's cached translation."""
        decided_by = [self.fingerprints[batch.model], dtype, asdict(batch), source, partition]
        return "cache:" + hashlib.sha256(json.dumps(decided_by).encode()).hexdigest()

    async def get(self, keys: list[str]) -> list[TranslationResult | None]:
        found = await self.storage.get_many(keys)
        return [None if data is None else from_bytes(data) for data in found]

    async def put(self, keys: list[str], results: list[TranslationResult]) -> None:
        await self.storage.put_many({key: to_bytes(result) for key, result in zip(keys, results)}, self.ttl_s)
