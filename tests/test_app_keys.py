"""API keys with limits (app/keys.py, app/limits.py): `nmt keys`, 403 for a wrong key, 429
"Slowdown: N per 1 minute" past a key's or a client's requests per minute, reset a minute later,
and a key's char_limit."""

from __future__ import annotations

import asyncio
import hashlib
import math
import subprocess
import sys

import pytest

from app.keys import KeyStore
from app.limits import RateLimiter
from app.settings import Settings
from app.storage import MemoryStorage
from tests.conftest import ready_client


class Clock:
    def __init__(self, now: float = 1_000_040.0):  # 20 s into a minute
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_counts_a_sliding_minute_and_says_when_to_retry():
    clock = Clock()
    limiter = RateLimiter(MemoryStorage(), clock)
    admit = lambda client, limit, cost=1: asyncio.run(limiter.admit(client, limit, cost))  # noqa: E731
    assert all(admit("a", 3) is None for _ in range(3))
    retry = admit("a", 3)
    assert retry == pytest.approx(40.0)  # the current minute is full: its end
    assert admit("b", 3) is None  # clients are counted apart
    assert admit("a", 0) is None  # 0: no limit
    clock.now += 45  # 5 s into the next minute: the previous one still weighs 55/60 x 3 = 2.75
    assert admit("a", 3) == pytest.approx(15.0)  # 2.75 + 1 > 3; at 20 s the weight is 2 and one more fits
    clock.now += 16  # 21 s in: the previous minute weighs 1.95
    assert admit("a", 3) is None and admit("a", 3) is not None  # 1.95 + 1 <= 3, then 1.95 + 1 + 1 > 3
    clock.now += 60
    assert admit("a", 3) is None
    assert admit("c", 5, cost=5) is None and admit("c", 5) is not None  # a batch counts its texts
    assert admit("d", 2, cost=5) == math.inf  # a request that costs more than the limit never fits


def test_memory_storage_expires_counters_and_bounds_bytes_per_kind():
    clock = Clock(0.0)
    storage = MemoryStorage({"file": 10}, clock)
    run = asyncio.run
    assert run(storage.add("limit:x", 2, ttl_s=10)) == 2 and run(storage.add("limit:x", 1, ttl_s=10)) == 3
    clock.now = 11
    assert run(storage.add("limit:x", 0, ttl_s=10)) == 0  # expired: a new count
    assert run(storage.put("file:a", b"12345", 60)) and run(storage.put("file:b", b"123456", 60))
    assert run(storage.get("file:a")) is None and run(storage.get("file:b")) == b"123456"  # the oldest went
    assert not run(storage.put("file:c", b"x" * 11, 60))  # larger than its kind's budget
    run(storage.put_many({"file:c": b"1", "file:d": b"22"}, 60))
    assert run(storage.get_many(["file:d", "file:none", "file:c"])) == [b"22", None, b"1"]
    clock.now = 100
    assert run(storage.get("file:b")) is None


def test_memory_storage_drops_what_expired_as_the_next_entry_comes():
    """The next put (or new counter) of a kind drops its least recently used entries while they
    have expired; an entry stored again lives on from its new time, and one used since waits
    behind the live ones until a get finds it expired (bench/storage.py measures the cost)."""
    clock = Clock(0.0)
    storage = MemoryStorage({"cache": 10_000}, clock)
    run = asyncio.run
    for i in range(1000):
        run(storage.put(f"cache:{i}", b"x", 10))
    clock.now = 5
    run(storage.put("cache:7", b"yy", 10))  # again: lives to 15
    assert run(storage.get("cache:0")) == b"x"  # used: now the most recently used, still expiring at 10
    assert storage.bytes["cache"] == 1001
    clock.now = 11
    run(storage.put("cache:new", b"z", 10))
    assert storage.count("cache") == 3 and storage.bytes["cache"] == 4  # cache:0 waits behind cache:7
    assert run(storage.get_many(["cache:0", "cache:7", "cache:999"])) == [None, b"yy", None]
    assert storage.count("cache") == 2 and storage.bytes["cache"] == 3
    assert run(storage.add("limit:a", 1, ttl_s=5)) == 1 and run(storage.add("limit:a", 2, ttl_s=5)) == 3
    clock.now = 22
    assert storage.count("cache") == 0 and storage.bytes["cache"] == 0  # counted as a scrape asks
    assert run(storage.add("limit:b", 1, ttl_s=5)) == 1 and storage.count("limit") == 1  # limit:a went
    assert run(storage.add("limit:a", 4, ttl_s=5)) == 4  # a new count


def test_key_store_round_trip(tmp_path):
    store = KeyStore(tmp_path / "keys.db")
    assert store.lookup("nope") is None and not store and not (tmp_path / "keys.db").exists()  # reading creates nothing
    key, record = store.add(10, char_limit=50)
    assert store.lookup(key) == record and len(key) >= 32 and store
    assert store.add(0, "mine", char_limit=0)[1].char_limit is None  # 0: the server's
    assert store.lookup("mine").req_limit == 0
    store.add(7, "mine")  # replaced
    assert [k.req_limit for k in store.all()] == [10, 7]
    assert store.lookup("mine\ud800") is None and store.lookup(key[:-1]) is None
    assert store.remove("mine") and not store.remove("mine")
    # only digests are kept, in a file only its owner reads
    assert (tmp_path / "keys.db").stat().st_mode & 0o777 == 0o600
    assert key.encode() not in (tmp_path / "keys.db").read_bytes() and record.digest == hashlib.sha256(
        key.encode()).hexdigest()
    with pytest.raises(ValueError):
        store.add(-1)
    assert store.remove(key) and not store  # the last one gone: no keys in force


def test_nmt_keys_cli(tmp_path):
    db = str(tmp_path / "k.db")
    run = lambda *args: subprocess.run([sys.executable, "-m", "nmt", "keys", "--db", db, *args],  # noqa: E731
                                       capture_output=True, text=True)
    added = run("add", "120", "--char-limit", "5000")
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()
    assert run("add", "5", "--key", "fixed").stdout.strip() == "fixed"
    listed = run("list").stdout
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert f"{key[:4]}…\t{digest[:12]}\t120 requests/minute, 5000 characters/text" in listed
    assert "fixe…\t" in listed and "5 requests/minute" in listed and key not in listed  # shown once, at add
    assert run("remove", digest[:12]).returncode == 0 and key[:4] + "…" not in run("list").stdout
    assert run("remove", "fixed").returncode == 0
    gone = run("remove", "fixed")
    assert gone.returncode != 0 and "no such key" in gone.stderr


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tmp_path_factory):
    db = tmp_path_factory.mktemp("keys") / "keys.db"
    store = KeyStore(db)
    store.add(3, "three-per-minute", char_limit=20)
    store.add(0, "unlimited")
    settings = Settings(model_dirs=[str(tiny_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        keys_db=str(db), req_limit=2, max_chars=400)
    with ready_client(settings) as client:
        yield client, store


def lt(client, key=None, q="Open the file.", headers=None):
    body = {"q": q, "source": "en", "target": "de"} | ({"api_key": key} if key else {})
    return client.post("/translate", json=body, headers=headers or {})


def test_limits_per_key_and_per_client_address(served, monkeypatch):
    client, store = served
    limiter = client.app.state.service.limiter
    clock = Clock()
    monkeypatch.setattr(limiter, "clock", clock)
    # without a key: NMT_REQ_LIMIT=2 per minute for this address
    assert [lt(client).status_code for _ in range(3)] == [200, 200, 429]
    refused = lt(client)
    assert refused.json() == {"error": "Slowdown: 2 per 1 minute"} and refused.headers["retry-after"] == "40"
    # a proxy's X-Forwarded-For is not trusted unless told to
    assert lt(client, headers={"x-forwarded-for": "10.0.0.9"}).status_code == 429
    monkeypatch.setattr(client.app.state.service.settings, "trust_forwarded_for", True)
    assert lt(client, headers={"x-forwarded-for": "10.0.0.9, 10.0.0.1"}).status_code == 200
    # a key has its own count and limit, on every route that translates or detects
    assert lt(client, "three-per-minute").status_code == 200
    v1 = client.post("/v1/translate", json={"text": "Open.", "source": "en", "target": "de"},
                     headers={"x-api-key": "three-per-minute"})
    assert v1.status_code == 200
    assert lt(client, "three-per-minute").status_code == 200
    assert lt(client, "three-per-minute").json() == {"error": "Slowdown: 3 per 1 minute"}
    assert all(lt(client, "unlimited").status_code == 200 for _ in range(5))
    # a minute later (and the previous one's weight gone) everything is admitted again
    clock.now += 120
    assert lt(client).status_code == 200 and lt(client, "three-per-minute").status_code == 200
    # a key removed with `nmt keys remove` stops working at once
    store.add(0, "short-lived")
    assert lt(client, "short-lived").status_code == 200
    store.remove("short-lived")
    assert lt(client, "short-lived").json() == {"error": "Invalid API key"}
    assert 'nmt_rate_limited_total' in client.get("/metrics").text


def test_key_char_limit(served):
    client, _ = served
    long_text = "Open the file and save it."  # 26 characters
    assert lt(client, "three-per-minute", q=long_text).json() == {"error": "q has 26 characters; at most 20"}
    assert lt(client, "unlimited", q=long_text).status_code == 200
    assert lt(client, "wrong").status_code == 403


def test_wrong_keys_are_counted_per_address(served, monkeypatch):
    client, _ = served
    monkeypatch.setattr(client.app.state.service.settings, "max_key_failures", 3)
    answers = [lt(client, f"guess-{i}").status_code for i in range(5)]  # (earlier tests guessed once)
    first = answers.index(429)
    assert 1 <= first <= 3 and set(answers[:first]) == {403} and set(answers[first:]) == {429}, answers


def test_a_file_of_keys_in_plain_text_becomes_digests(tmp_path):
    import sqlite3

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as old:  # the schema keys were kept in before
        old.execute("CREATE TABLE api_keys (key_sha256 TEXT PRIMARY KEY, api_key TEXT NOT NULL, "
                    "req_limit INTEGER NOT NULL, char_limit INTEGER, created REAL NOT NULL)")
        old.execute("INSERT INTO api_keys VALUES (?, ?, 5, NULL, 0)",
                    (hashlib.sha256(b"old-secret-key").hexdigest(), "old-secret-key"))
    store = KeyStore(db)
    assert store.lookup("old-secret-key").req_limit == 5
    store.close()
    assert b"old-secret-key" not in db.read_bytes() and db.stat().st_mode & 0o777 == 0o600
