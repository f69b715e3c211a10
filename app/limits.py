"""Requests per minute per client, as LibreTranslate limits them: a key's `req_limit`, else the
server's NMT_REQ_LIMIT per client address; past it, 429 "Slowdown: N per 1 minute".

A request is admitted while the client's count over the last minute is under its limit, and then
counts as many requests as it has texts (a batch of 10 costs 10, as in LibreTranslate). The
last minute is a sliding window estimated from two fixed ones: the previous minute's count,
weighted by how much of it the window still covers, plus the current minute's. Counters live in
a `Counters` store: in this process by default.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Protocol

WINDOW_S = 60.0


class Counters(Protocol):
    def get(self, name: str) -> int: ...

    def add(self, name: str, amount: int, ttl_s: float) -> int:
        """Add to a counter (created at 0 and dropped ttl_s after its creation); its new value."""


class MemoryCounters:
    """Counters of this process. Expired ones are swept as new ones come, so memory follows the
    clients of the last two minutes."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._values: dict[str, tuple[int, float]] = {}  # name -> (value, expiry)
        self._lock = threading.Lock()
        self._next_sweep = 0.0

    def get(self, name: str) -> int:
        with self._lock:
            value, expiry = self._values.get(name, (0, 0.0))
            return value if expiry > self.clock() else 0

    def add(self, name: str, amount: int, ttl_s: float) -> int:
        now = self.clock()
        with self._lock:
            if now >= self._next_sweep:
                self._values = {k: v for k, v in self._values.items() if v[1] > now}
                self._next_sweep = now + ttl_s
            value, expiry = self._values.get(name, (0, 0.0))
            if expiry <= now:
                value, expiry = 0, now + ttl_s
            self._values[name] = (value + amount, expiry)
            return value + amount

    def __len__(self) -> int:
        return len(self._values)


class RateLimiter:
    def __init__(self, counters: Counters, clock=time.time):
        self.counters, self.clock = counters, clock

    def admit(self, client: str, limit: int, cost: int = 1) -> float | None:
        """None when `client` is under `limit` requests per minute (0: no limit), and its `cost`
        is counted; else the seconds until it is likely under again (Retry-After)."""
        if limit <= 0:
            return None
        now = self.clock()
        window = math.floor(now / WINDOW_S)
        covered = 1.0 - (now / WINDOW_S - window)  # share of the previous minute still in the last 60 s
        current = self.counters.get(f"{client}:{window}")
        previous = self.counters.get(f"{client}:{window - 1}")
        if previous * covered + current >= limit:
            if current >= limit:  # only the next minute frees it
                return (window + 1) * WINDOW_S - now
            # the previous minute's weight fades linearly: when does it fall under limit - current?
            under_at = (1.0 - (limit - current) / previous) * WINDOW_S  # seconds into this minute
            return max(1.0, under_at - (now - window * WINDOW_S))
        self.counters.add(f"{client}:{window}", cost, 2 * WINDOW_S)
        return None
