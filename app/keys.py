"""API keys with limits, as LibreTranslate has them: each key has `req_limit` (requests per minute)
and optionally `char_limit` (characters per text), managed with `nmt keys add|list|remove` while
the server runs. They live in one SQLite file (NMT_KEYS_DB; nothing to run), or with
NMT_REDIS_URL in a Redis hash every replica reads (no TTL, so Redis never evicts them).

A key is looked up by its SHA-256 (the index compares digests, not the secret), and the stored
key is then compared with `hmac.compare_digest`, so how long a lookup takes tells nothing about
how much of a guess was right.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """CREATE TABLE IF NOT EXISTS api_keys (
    key_sha256 TEXT PRIMARY KEY,
    api_key TEXT NOT NULL,
    req_limit INTEGER NOT NULL,
    char_limit INTEGER,
    created REAL NOT NULL
)"""


@dataclass(frozen=True)
class ApiKey:
    key: str
    req_limit: int  # requests per minute; 0: no limit
    char_limit: int | None  # characters per text; None: the server's default


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class KeyStore:
    """The keys of one SQLite file. The server opens it read-mostly: a file that does not exist
    holds no keys (and is not created until `nmt keys add`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _connect(self, create: bool) -> sqlite3.Connection | None:
        if self._db is None:
            if not create and not self.path.exists():
                return None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
            self._db.execute(SCHEMA)
            self._db.commit()
        return self._db

    def lookup(self, key: str) -> ApiKey | None:
        with self._lock:
            db = self._connect(create=False)
            if db is None:
                return None
            row = db.execute("SELECT api_key, req_limit, char_limit FROM api_keys WHERE key_sha256 = ?",
                             (_digest(key),)).fetchone()
        if row is None or not hmac.compare_digest(row[0].encode(), key.encode("utf-8", "surrogatepass")):
            return None
        return ApiKey(row[0], row[1], row[2])

    def add(self, req_limit: int, key: str | None = None, char_limit: int | None = None) -> ApiKey:
        """Add a key (a random one unless given; an existing key gets the new limits)."""
        if req_limit < 0 or (char_limit is not None and char_limit < 0):
            raise ValueError("req_limit and char_limit must not be negative")
        key = key or secrets.token_urlsafe(24)
        char_limit = char_limit or None  # 0: no limit of its own, as LibreTranslate's ltmanage
        with self._lock:
            db = self._connect(create=True)
            db.execute("INSERT OR REPLACE INTO api_keys VALUES (?, ?, ?, ?, ?)",
                       (_digest(key), key, req_limit, char_limit, time.time()))
            db.commit()
        return ApiKey(key, req_limit, char_limit)

    def remove(self, key: str) -> bool:
        with self._lock:
            db = self._connect(create=False)
            if db is None:
                return False
            removed = db.execute("DELETE FROM api_keys WHERE key_sha256 = ?", (_digest(key),)).rowcount
            db.commit()
        return removed > 0

    def all(self) -> list[ApiKey]:
        with self._lock:
            db = self._connect(create=False)
            rows = [] if db is None else db.execute(
                "SELECT api_key, req_limit, char_limit FROM api_keys ORDER BY created").fetchall()
        return [ApiKey(*row) for row in rows]

    def __bool__(self) -> bool:
        return bool(self.all())

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class RedisKeyStore:
    """The same keys in the Redis hash `nmt:api_keys` (field: the key's SHA-256)."""

    HASH = "nmt:api_keys"

    def __init__(self, url: str):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.path = url  # what messages name
        # one retry on a broken connection: a pooled one is dead after Redis restarts
        self.client = redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0,
                                     retry=Retry(NoBackoff(), 1), retry_on_error=[redis.ConnectionError])

    def _call(self, operation, *args):
        import redis

        from app.storage import StorageUnavailable

        try:
            return operation(*args)
        except (redis.RedisError, OSError) as e:
            raise StorageUnavailable(f"Redis at {self.path} cannot be reached ({type(e).__name__}: {e})") from None

    def lookup(self, key: str) -> ApiKey | None:
        found = self._call(self.client.hget, self.HASH, _digest(key))
        if found is None:
            return None
        fields = json.loads(found)
        if not hmac.compare_digest(fields["key"].encode(), key.encode("utf-8", "surrogatepass")):
            return None
        return ApiKey(fields["key"], fields["req_limit"], fields["char_limit"])

    def add(self, req_limit: int, key: str | None = None, char_limit: int | None = None) -> ApiKey:
        if req_limit < 0 or (char_limit is not None and char_limit < 0):
            raise ValueError("req_limit and char_limit must not be negative")
        key = key or secrets.token_urlsafe(24)
        record = {"key": key, "req_limit": req_limit, "char_limit": char_limit or None, "created": time.time()}
        self._call(self.client.hset, self.HASH, _digest(key), json.dumps(record))
        return ApiKey(key, req_limit, char_limit or None)

    def remove(self, key: str) -> bool:
        return self._call(self.client.hdel, self.HASH, _digest(key)) > 0

    def all(self) -> list[ApiKey]:
        records = sorted((json.loads(v) for v in self._call(self.client.hvals, self.HASH)), key=lambda r: r["created"])
        return [ApiKey(r["key"], r["req_limit"], r["char_limit"]) for r in records]

    def __bool__(self) -> bool:
        try:
            return self._call(self.client.hlen, self.HASH) > 0
        except Exception:
            return False

    def close(self) -> None:
        self.client.close()


def open_keys(keys_db: str, redis_url: str = "") -> KeyStore | RedisKeyStore:
    return RedisKeyStore(redis_url) if redis_url else KeyStore(keys_db)


# --- nmt keys ---------------------------------------------------------------------------------

def keys_command(args) -> None:
    from app.settings import Settings

    settings = Settings()
    redis_url = args.redis if args.redis is not None else settings.redis_url
    store = open_keys(args.db or settings.keys_db, "" if args.db else redis_url)
    if args.action == "add":
        print(store.add(args.req_limit, args.key, args.char_limit).key)
    elif args.action == "remove":
        if not store.remove(args.key):
            raise SystemExit(f"nmt keys: no such key in {store.path}")
        print(args.key)
    else:
        keys = store.all()
        if not keys:
            print(f"no API keys in {store.path}")
        for k in keys:
            limits = f"{k.req_limit} requests/minute" if k.req_limit else "no request limit"
            limits += f", {k.char_limit} characters/text" if k.char_limit else ""
            print(f"{k.key}\t{limits}")


def add_keys_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, help="the keys' SQLite file (default: NMT_KEYS_DB or db/api_keys.db)")
    p.add_argument("--redis", default=None, help="the Redis the servers share (default: NMT_REDIS_URL); keys go there")
    actions = p.add_subparsers(dest="action")
    add = actions.add_parser("add", help="add a key (prints it)")
    add.add_argument("req_limit", type=int, help="requests per minute (0: no limit)")
    add.add_argument("--key", default=None, help="the key itself (default: a random one)")
    add.add_argument("--char-limit", type=int, default=None, help="characters per text (default: the server's)")
    remove = actions.add_parser("remove", help="remove a key")
    remove.add_argument("key")
    actions.add_parser("list", help="list the keys and their limits (the default)")
    p.set_defaults(func=keys_command)
