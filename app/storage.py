"""What the service keeps between requests: stored alignments, translated files, rate-limit
counters and cached translations, behind one small interface with two implementations.

    storage = open_storage(settings)               # MemoryStorage, or RedisStorage with NMT_REDIS_URL
    await storage.put("file:ab12", data, ttl_s=1800, max_bytes=...)
    await storage.get("file:ab12")                  # bytes, or None (never stored, expired or evicted)
    await storage.add("limit:key:3f2a:29340117", 1, ttl_s=120)   # a counter's new value

The embedded default keeps everything in this process, bounded per kind of key (the part before
the first ':') by its own byte budget, the oldest going first. Redis makes every replica see the
same data: replica B serves an alignment replica A stored. There the budget is Redis' own
(`maxmemory` with `volatile-lru`: only keys with a TTL, which all of these have, are evicted).
`nmt serve` with several HTTP processes and no Redis keeps one MemoryStorage in its engine process
(app/engine.py), which each HTTP process reaches over the engine's socket (RemoteStorage).

When the store cannot be reached, the calls raise StorageUnavailable: what needs the store answers
503 saying so, translation goes on (the cache is skipped), and /ready names the reason.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol


class StorageUnavailable(Exception):
    """The shared store (Redis, or the engine process's) cannot be reached. Its message, which clients see, says only that;
    `detail` says why, for the log (the store's address without its password)."""

    def __init__(self, detail: str):
        super().__init__("the shared store is unavailable")
        self.detail = detail


def _without(error: Exception, url: str) -> str:
    return str(error).replace(url, redacted(url))


class QuotaExceeded(Exception):
    """A client would store more than its share of a kind of stored result; the message says so."""


async def charge_quota(storage: Storage, what: str, owner: str, size: int, quota: int, ttl_s: float,
                       setting: str) -> None:
    """Count `size` bytes of `what` stored by `owner` (a key's digest or an address) over the
    results' lifetime `ttl_s`; QuotaExceeded, and nothing counted, past `quota` (0: no quota). The
    count lives in the storage (Redis: shared by every replica), so one client's results cannot
    fill the store and evict everyone else's."""
    if quota <= 0:
        return
    counter = f"quota:{what}:{owner}"
    if await storage.add(counter, size, ttl_s) > quota:
        await storage.add(counter, -size, ttl_s)
        raise QuotaExceeded(f"this client has stored its share of {what} for now: at most {quota:,} bytes "
                            f"within {ttl_s:g} s ({setting}); retry later")


def redacted(url: str) -> str:
    """A store URL without its password: redis://:***@host:6379/0."""
    return re.sub(r"(?<=://)([^/@]*?):[^/@]*@", r"\1:***@", url)


class Storage(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        """get() for each key, in one round trip."""

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        """Store `value` for ttl_s seconds; False when it alone exceeds its kind's budget."""

    async def put_many(self, values: dict[str, bytes], ttl_s: float) -> None:
        """put() for each key, in one round trip."""

    async def add(self, key: str, amount: int, ttl_s: float) -> int:
        """Add to a counter (0 when new, dropped ttl_s after it was created); its new value."""

    async def check(self) -> None:
        """Raise StorageUnavailable when the store cannot be used."""

    async def close(self) -> None: ...


def kind(key: str) -> str:
    return key.split(":", 1)[0]


class MemoryStorage:
    """This process's memory: per kind of key, an LRU bounded by `budgets[kind]` bytes and
    `max_items[kind]` entries (a kind without them is unbounded: counters, whose keys expire
    within two minutes). The next put or new counter of a kind drops its least recently used
    entries while they have expired, and stops at the first that has not: never a walk over the
    whole kind (a 64 MiB cache holds a few hundred thousand entries). An expired entry that was
    used more recently than a live one waits for its turn, a get (which finds it expired) or the
    budget; counters are never moved by use, so they go in the order they were made."""

    def __init__(self, budgets: dict[str, int] | None = None, clock=time.monotonic,
                 max_items: dict[str, int] | None = None):
        self.budgets, self.clock, self.max_items = budgets or {}, clock, max_items or {}
        self._values: dict[str, OrderedDict[str, tuple[bytes | int, float]]] = {}  # kind -> key -> (value, expiry)
        self.bytes: dict[str, int] = {}

    def _entries(self, key: str) -> OrderedDict:
        return self._values.setdefault(kind(key), OrderedDict())

    def _drop(self, entries: OrderedDict, key: str) -> None:
        value, _ = entries.pop(key)
        if isinstance(value, bytes):
            self.bytes[kind(key)] -= len(value)

    def _expire(self, entries: OrderedDict) -> None:
        """Drop the least recently used entries while their time is up."""
        now = self.clock()
        while entries:
            key, (_, expiry) = next(iter(entries.items()))
            if expiry > now:
                return
            self._drop(entries, key)

    async def get(self, key: str) -> bytes | None:
        entries = self._entries(key)
        found = entries.get(key)
        if found is None:
            return None
        if found[1] <= self.clock():
            self._drop(entries, key)
            return None
        entries.move_to_end(key)
        return found[0] if isinstance(found[0], bytes) else None

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        return [await self.get(key) for key in keys]

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        budget, most = self.budgets.get(kind(key)), self.max_items.get(kind(key))
        if (budget is not None and len(value) > budget) or most == 0:
            return False
        entries = self._entries(key)
        if key in entries:
            self._drop(entries, key)
        self._expire(entries)
        entries[key] = (value, self.clock() + ttl_s)
        self.bytes[kind(key)] = self.bytes.get(kind(key), 0) + len(value)
        while (budget is not None and self.bytes[kind(key)] > budget) or (most is not None and len(entries) > most):
            self._drop(entries, next(iter(entries)))
        return True

    async def put_many(self, values: dict[str, bytes], ttl_s: float) -> None:
        for key, value in values.items():
            await self.put(key, value, ttl_s)

    async def add(self, key: str, amount: int, ttl_s: float) -> int:
        entries = self._entries(key)
        value, expiry = entries.get(key, (0, 0.0))
        if expiry > self.clock():
            entries[key] = (value + amount, expiry)
            return value + amount
        self._expire(entries)  # a new counter
        entries.pop(key, None)  # (an expired one: the new count goes last)
        entries[key] = (amount, self.clock() + ttl_s)
        return amount

    def count(self, kind_: str) -> int:
        if kind_ in self._values:
            self._expire(self._values[kind_])
        return len(self._values.get(kind_, ()))

    async def check(self) -> None:
        return None

    async def close(self) -> None:
        return None


class RedisStorage:
    """A Redis server shared by every replica. Keys are prefixed (`prefix`), values stored with
    their TTL; a value larger than its kind's budget is refused here, the total is Redis'."""

    def __init__(self, url: str, budgets: dict[str, int] | None = None, prefix: str = "nmt:",
                 timeout_s: float = 2.0):
        import redis
        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.url, self.budgets, self.prefix = url, budgets or {}, prefix
        # one retry on a broken connection: the pooled ones are all dead after Redis restarts, and
        # the first call on each would otherwise answer 503 with Redis back up
        self.client = redis.asyncio.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                             retry=Retry(NoBackoff(), 1), retry_on_error=[redis.ConnectionError])

    async def _call(self, operation):
        import redis

        try:
            return await operation
        except (TimeoutError, redis.ConnectionError, redis.TimeoutError, OSError) as e:
            raise StorageUnavailable(f"Redis at {redacted(self.url)} cannot be reached ({type(e).__name__}: "
                                     f"{_without(e, self.url)})") from None
        except redis.RedisError as e:
            raise StorageUnavailable(f"Redis at {redacted(self.url)} refused the operation ({type(e).__name__}: "
                                     f"{_without(e, self.url)})") from None

    async def get(self, key: str) -> bytes | None:
        return await self._call(self.client.get(self.prefix + key))

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        return await self._call(self.client.mget([self.prefix + key for key in keys]))

    def _fits(self, key: str, value: bytes) -> bool:
        budget = self.budgets.get(kind(key))
        return budget is None or len(value) <= budget

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        if not self._fits(key, value):
            return False
        await self.put_many({key: value}, ttl_s)
        return True

    async def put_many(self, values: dict[str, bytes], ttl_s: float) -> None:
        async def send():
            async with self.client.pipeline(transaction=False) as pipe:
                for key, value in values.items():
                    if self._fits(key, value):
                        pipe.set(self.prefix + key, value, px=max(1, int(ttl_s * 1000)))
                await pipe.execute()

        await self._call(send())

    async def add(self, key: str, amount: int, ttl_s: float) -> int:
        async def increment():
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.incrby(self.prefix + key, amount)
                pipe.pexpire(self.prefix + key, max(1, int(ttl_s * 1000)), nx=True)  # set once, at creation
                value, _ = await pipe.execute()
            return int(value)

        return await self._call(increment())

    async def check(self) -> None:
        await self._call(self.client.ping())

    async def close(self) -> None:
        await self.client.aclose()


class RemoteStorage:
    """The MemoryStorage of another process, reached through `ask(operation, *arguments)`, which
    runs that storage's method of that name there and returns its result, or raises
    StorageUnavailable (the engine process of `nmt serve`, over its socket: RemoteEngine.store)."""

    OPERATIONS = ("get", "get_many", "put", "put_many", "add", "check")  # what `ask` may run

    def __init__(self, ask: Callable[..., Awaitable]):
        self.ask = ask

    async def get(self, key: str) -> bytes | None:
        return await self.ask("get", key)

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        return await self.ask("get_many", keys) if keys else []

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        return await self.ask("put", key, value, ttl_s)

    async def put_many(self, values: dict[str, bytes], ttl_s: float) -> None:
        if values:
            await self.ask("put_many", values, ttl_s)

    async def add(self, key: str, amount: int, ttl_s: float) -> int:
        return await self.ask("add", key, amount, ttl_s)

    async def check(self) -> None:
        await self.ask("check")

    async def close(self) -> None:
        return None


def open_storage(settings, remote: Callable[..., Awaitable] | None = None) -> Storage:
    """Redis at NMT_REDIS_URL; else, given `remote` (RemoteStorage's `ask`), the store of another
    process; else this process's memory; budgets from the settings."""
    if settings.redis_url:
        return RedisStorage(settings.redis_url, byte_budgets(settings))
    if remote is not None:
        return RemoteStorage(remote)
    return MemoryStorage(byte_budgets(settings), max_items={"alignment": settings.alignment_max_items})


def byte_budgets(settings) -> dict[str, int]:
    """Bytes each kind of stored value may hold in all."""
    return {"file": settings.file_store_bytes, "alignment": settings.alignment_max_bytes, "cache": settings.cache_bytes}
