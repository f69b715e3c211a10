"""Translated files waiting to be downloaded, in the service's storage (app/storage.py) under a
random id for NMT_FILE_TTL_S: in this process within NMT_FILE_STORE_BYTES (the oldest go first),
or in Redis, where every replica finds them."""

from __future__ import annotations

import json
import secrets
from typing import NamedTuple

from app.storage import Storage, charge_quota


class StoredFile(NamedTuple):
    name: str
    data: bytes
    characters: int  # of text the file held (what DeepL's document status reports as billed)


class FileStore:
    def __init__(self, storage: Storage, ttl_s: float, client_bytes: int = 0):
        self.storage, self.ttl_s, self.client_bytes = storage, ttl_s, client_bytes

    async def put(self, name: str, data: bytes, owner: str = "", characters: int = 0) -> str | None:
        """Its id; None when it alone is larger than the store takes; QuotaExceeded past the
        owner's share (NMT_CLIENT_FILE_BYTES)."""
        await charge_quota(self.storage, "translated files", owner, len(data), self.client_bytes, self.ttl_s,
                           "NMT_CLIENT_FILE_BYTES")
        file_id = secrets.token_hex(16)
        header = json.dumps({"name": name, "characters": characters}).encode() + b"\n"
        return file_id if await self.storage.put(f"file:{file_id}", header + data, self.ttl_s) else None

    async def get(self, file_id: str) -> StoredFile | None:
        """The file, or None when it expired, was evicted or never existed."""
        if not file_id.isalnum():
            return None
        value = await self.storage.get(f"file:{file_id}")
        if value is None:
            return None
        header, _, data = value.partition(b"\n")
        meta = json.loads(header)
        return StoredFile(meta["name"], data, meta.get("characters", 0))
