"""Translated files waiting to be downloaded: bytes under a random id, for NMT_FILE_TTL_S,
within NMT_FILE_STORE_BYTES (the oldest go first when a new one needs the room)."""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class Blob:
    name: str  # the file name a download gets
    data: bytes
    expires: float


class BlobStore:
    def __init__(self, max_bytes: int, ttl_s: float, clock=time.monotonic):
        self.max_bytes, self.ttl_s, self.clock = max_bytes, ttl_s, clock
        self._blobs: OrderedDict[str, Blob] = OrderedDict()  # oldest first
        self._lock = threading.Lock()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._blobs)

    def put(self, name: str, data: bytes) -> str | None:
        """Its id; None when it alone is larger than the store."""
        if len(data) > self.max_bytes:
            return None
        key = secrets.token_hex(16)
        with self._lock:
            now = self.clock()
            while self._blobs and (next(iter(self._blobs.values())).expires <= now
                                   or self.bytes + len(data) > self.max_bytes):
                self.bytes -= len(self._blobs.popitem(last=False)[1].data)
            self._blobs[key] = Blob(name, data, now + self.ttl_s)
            self.bytes += len(data)
        return key

    def get(self, key: str) -> Blob | None:
        with self._lock:
            blob = self._blobs.get(key)
            if blob is None or blob.expires <= self.clock():
                return None
            return blob
