"""API keys with limits, as LibreTranslate has them: each key has `req_limit` (requests per minute)
and optionally `char_limit` (characters per text), managed with `nmt keys add|list|remove` while
the server runs. They live in one SQLite file (NMT_KEYS_DB; nothing to run), or with
NMT_REDIS_URL in a Redis hash every replica reads (no TTL, so Redis never evicts them).

Only a key's SHA-256 is stored (with its first characters, to tell keys apart), in a file only
its owner reads (0600): a copy of the file, or of Redis, gives no key away. `nmt keys add` shows a
new key once. A key is looked up by its digest, so how long a lookup takes tells nothing about how
much of a guess was right.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """CREATE TABLE IF NOT EXISTS api_key_digests (
    key_sha256 TEXT PRIMARY KEY,
    hint TEXT NOT NULL,
    req_limit INTEGER NOT NULL,
    char_limit INTEGER,
    created REAL NOT NULL
)"""
OLD_TABLE = "api_keys"  # before keys were kept as digests only: migrated, then dropped
HINT = 4  # characters of a key kept to tell keys apart in `nmt keys list`


@dataclass(frozen=True)
class ApiKey:
    digest: str  # the key's SHA-256: all that is stored of it
    hint: str  # its first HINT characters
    req_limit: int  # requests per minute; 0: no limit
    char_limit: int | None  # characters per text; None: the server's default


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def configured_key(key: str) -> ApiKey:
    """A key from NMT_API_KEYS: no limits."""
    return ApiKey(_digest(key), key[:HINT], 0, None)


def _new_key(key: str | None, req_limit: int, char_limit: int | None) -> tuple[str, ApiKey]:
    if req_limit < 0 or (char_limit is not None and char_limit < 0):
        raise ValueError("req_limit and char_limit must not be negative")
    key = key or secrets.token_urlsafe(24)
    return key, ApiKey(_digest(key), key[:HINT], req_limit, char_limit or None)  # 0: the server's, as ltmanage


class KeyStore:
    """The keys of one SQLite file (mode 0600), as SHA-256 digests: a copy of the file gives no
    key away. The server opens it read-mostly: a file that does not exist holds no keys (and is not
    created until `nmt keys add`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _connect(self, create: bool) -> sqlite3.Connection | None:
        if self._db is None:
            if not create and not self.path.exists():
                return None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            os.chmod(self.path, 0o600)
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
            self._db.execute(SCHEMA)
            self._migrate(self._db)
            self._db.commit()
        return self._db

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        """Keys a file kept in plain text (the table api_keys) become digests; the table goes."""
        if db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", (OLD_TABLE,)).fetchone():
            db.execute(f"INSERT OR IGNORE INTO api_key_digests SELECT key_sha256, substr(api_key, 1, {HINT}), "
                       f"req_limit, char_limit, created FROM {OLD_TABLE}")
            db.execute(f"DROP TABLE {OLD_TABLE}")
            db.commit()
            db.execute("VACUUM")  # the dropped pages held the keys

    def lookup(self, key: str) -> ApiKey | None:
        with self._lock:
            db = self._connect(create=False)
            if db is None:
                return None
            row = db.execute("SELECT key_sha256, hint, req_limit, char_limit FROM api_key_digests "
                             "WHERE key_sha256 = ?", (_digest(key),)).fetchone()
        return None if row is None else ApiKey(*row)

    def add(self, req_limit: int, key: str | None = None, char_limit: int | None = None) -> tuple[str, ApiKey]:
        """Add a key (a random one unless given; an existing key gets the new limits): the key,
        which is shown this once, and what is stored of it."""
        key, record = _new_key(key, req_limit, char_limit)
        with self._lock:
            db = self._connect(create=True)
            db.execute("INSERT OR REPLACE INTO api_key_digests VALUES (?, ?, ?, ?, ?)",
                       (record.digest, record.hint, record.req_limit, record.char_limit, time.time()))
            db.commit()
        return key, record

    def remove(self, key_or_digest: str) -> bool:
        """Remove a key, given as itself or as its digest (or at least 12 characters of it, as
        `nmt keys list` shows them)."""
        with self._lock:
            db = self._connect(create=False)
            if db is None:
                return False
            removed = db.execute("DELETE FROM api_key_digests WHERE key_sha256 = ?", (_digest(key_or_digest),)).rowcount
            if not removed and _is_digest_prefix(key_or_digest):
                found = db.execute("SELECT key_sha256 FROM api_key_digests WHERE key_sha256 LIKE ?",
                                   (key_or_digest + "%",)).fetchall()
                if len(found) == 1:
                    removed = db.execute("DELETE FROM api_key_digests WHERE key_sha256 = ?", found[0]).rowcount
            db.commit()
        return removed > 0

    def all(self) -> list[ApiKey]:
        with self._lock:
            db = self._connect(create=False)
            rows = [] if db is None else db.execute(
                "SELECT key_sha256, hint, req_limit, char_limit FROM api_key_digests ORDER BY created").fetchall()
        return [ApiKey(*row) for row in rows]

    def __bool__(self) -> bool:
        """Whether any key is stored (asked on every DeepL call: one row read, not every key's)."""
        with self._lock:
            db = self._connect(create=False)
            return db is not None and db.execute("SELECT 1 FROM api_key_digests LIMIT 1").fetchone() is not None

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def _is_digest_prefix(text: str) -> bool:
    return 12 <= len(text) <= 64 and all(c in "0123456789abcdef" for c in text)


class RedisKeyStore:
    """The same keys in the Redis hash `nmt:api_keys` (field: the key's SHA-256; value: its hint
    and limits, never the key)."""

    HASH = "nmt:api_keys"

    def __init__(self, url: str):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from app.storage import redacted

        self.path = redacted(url)  # what messages name
        # one retry on a broken connection: a pooled one is dead after Redis restarts
        self.client = redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0,
                                     retry=Retry(NoBackoff(), 1), retry_on_error=[redis.ConnectionError])

    def _call(self, operation, *args):
        import redis

        from app.storage import StorageUnavailable

        try:
            return operation(*args)
        except (redis.RedisError, OSError) as e:
            raise StorageUnavailable(f"Redis at {self.path} cannot be reached ({type(e).__name__})") from None

    def _record(self, digest: str, stored: bytes | str) -> ApiKey:
        fields = json.loads(stored)
        if "key" in fields:  # written before keys were kept as digests: rewritten without the key
            fields["hint"] = fields.pop("key")[:HINT]
            self._call(self.client.hset, self.HASH, digest, json.dumps(fields))
        return ApiKey(digest, fields["hint"], fields["req_limit"], fields["char_limit"])

    def lookup(self, key: str) -> ApiKey | None:
        digest = _digest(key)
        found = self._call(self.client.hget, self.HASH, digest)
        return None if found is None else self._record(digest, found)

    def add(self, req_limit: int, key: str | None = None, char_limit: int | None = None) -> tuple[str, ApiKey]:
        key, record = _new_key(key, req_limit, char_limit)
        fields = {"hint": record.hint, "req_limit": req_limit, "char_limit": record.char_limit, "created": time.time()}
        self._call(self.client.hset, self.HASH, record.digest, json.dumps(fields))
        return key, record

    def remove(self, key_or_digest: str) -> bool:
        if self._call(self.client.hdel, self.HASH, _digest(key_or_digest)) > 0:
            return True
        if not _is_digest_prefix(key_or_digest):
            return False
        found = [d for d in self._call(self.client.hkeys, self.HASH) if d.decode().startswith(key_or_digest)]
        return len(found) == 1 and self._call(self.client.hdel, self.HASH, found[0]) > 0

    def all(self) -> list[ApiKey]:
        stored = self._call(self.client.hgetall, self.HASH)
        records = [(json.loads(v).get("created", 0), self._record(d.decode(), v)) for d, v in stored.items()]
        return [record for _, record in sorted(records, key=lambda r: r[0])]

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
        print(store.add(args.req_limit, args.key, args.char_limit)[0])  # the only time the key is shown
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
            print(f"{k.hint}…\t{k.digest[:12]}\t{limits}")


def add_keys_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, help="the keys' SQLite file (default: NMT_KEYS_DB or db/api_keys.db)")
    p.add_argument("--redis", default=None, help="the Redis the servers share (default: NMT_REDIS_URL); keys go there")
    actions = p.add_subparsers(dest="action")
    add = actions.add_parser("add", help="add a key (prints it)")
    add.add_argument("req_limit", type=int, help="requests per minute (0: no limit)")
    add.add_argument("--key", default=None, help="the key itself (default: a random one)")
    add.add_argument("--char-limit", type=int, default=None, help="characters per text (default: the server's)")
    remove = actions.add_parser("remove", help="remove a key")
    remove.add_argument("key", help="the key, or its digest as `list` shows it")
    actions.add_parser("list", help="list the keys and their limits (the default)")
    p.set_defaults(func=keys_command)
