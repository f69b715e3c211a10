"""Requests per minute per client, as LibreTranslate limits them: a key's `req_limit`, else the
server's NMT_REQ_LIMIT per client address; past it, 429 "Slowdown: N per 1 minute".

A request is admitted while the client's count over the last minute and its own cost together
stay within the limit; it counts as many requests as it has texts (a batch of 10 costs 10, as in
LibreTranslate), and once split, as many as it has sentences. The
last minute is a sliding window estimated from two fixed ones: the previous minute's count,
weighted by how much of it the window still covers, plus the current minute's. The counters
live in the service's storage (app/storage.py): this process, or Redis, shared by every replica.

A request counts itself first and then looks at the count before it, taking the increment
back when it is refused. The increment is atomic (Redis INCRBY), so requests racing on several
replicas each see a different count before them and never admit more than the limit together;
at worst a request refused at the same moment briefly counts against another one.
"""

from __future__ import annotations

import math
import time

from app.storage import Storage

WINDOW_S = 60.0


def client_address(scope: dict, trust_forwarded_for: bool) -> str:
    """The address a request's limits count it by: its peer's, or behind a proxy that appends the
    address it saw to X-Forwarded-For (trust_forwarded_for), that one; what stands left of it the
    client wrote."""
    if trust_forwarded_for:
        forwarded = dict(scope.get("headers") or ()).get(b"x-forwarded-for")
        if forwarded:
            return forwarded.decode("latin-1").split(",")[-1].strip() or "unknown"
    client = scope.get("client")
    return client[0] if client else "unknown"


class RateLimiter:
    def __init__(self, storage: Storage, clock=time.time):
        self.storage, self.clock = storage, clock

    async def admit(self, client: str, limit: int, cost: int = 1) -> float | None:
        """None when `client`'s count over the last minute plus `cost` is within `limit` (0: no
        limit), and its `cost` is counted; else the seconds until it is likely to be (Retry-After),
        infinite for a cost over the limit itself."""
        if limit <= 0:
            return None
        if cost > limit:
            return math.inf
        now = self.clock()
        window = math.floor(now / WINDOW_S)
        covered = 1.0 - (now / WINDOW_S - window)  # share of the previous minute still in the last 60 s
        counter = f"limit:{client}:{window}"
        current = await self.storage.add(counter, cost, 2 * WINDOW_S) - cost  # this minute's count before us
        previous = await self.storage.add(f"limit:{client}:{window - 1}", 0, 2 * WINDOW_S)
        if previous * covered + current + cost <= limit:
            return None
        await self.storage.add(counter, -cost, 2 * WINDOW_S)  # refused: not counted
        if current + cost > limit:  # only the next minute frees it
            return (window + 1) * WINDOW_S - now
        # the previous minute's weight fades linearly: when does it fall to limit - current - cost?
        under_at = (1.0 - (limit - current - cost) / previous) * WINDOW_S  # seconds into this minute
        return max(1.0, under_at - (now - window * WINDOW_S))
