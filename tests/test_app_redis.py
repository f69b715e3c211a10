"""Scale-out: two real `nmt serve` replicas sharing a real redis-server (Debian's, with
its append-only file on): an alignment and a translated file made through one are fetched through
the other, a key's limit is shared, the translation cache hits across replicas, and Redis stopped
and restarted mid-test gives no 500 and keeps what was stored."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.keys import RedisKeyStore
from tests.conftest import wait_ready
from tests.test_app_e2e import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("redis-server") is None,
                                                  reason="needs redis-server (apt-get install redis-server)")]

ROOT = Path(__file__).resolve().parents[1]


def start_replica(checkpoint: Path, redis_url: str, logs: Path) -> tuple[str, subprocess.Popen]:
    """`nmt serve` of checkpoint on a free port, sharing redis_url; its output in a file under logs."""
    port = free_port()
    env = {**os.environ, "NMT_MODEL_DIRS": str(checkpoint), "NMT_WORKERS": "1", "NMT_THREADS_PER_WORKER": "1",
           "NMT_DTYPE": "float32", "NMT_REDIS_URL": redis_url, "NMT_DETECT_LANGUAGES": "en,de", "NMT_DETECT_PRELOAD": "true",
           "NMT_MAX_WAIT_MS": "2"}
    log = logs / f"nmt-replica-{port}.log"  # wait_ready shows its tail on a failure
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "nmt", "serve", "--host", "127.0.0.1", "--port", str(port)],
                                   cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)  # `nmt serve`
    process.log = log
    return f"http://127.0.0.1:{port}", process


@pytest.fixture(scope="module")
def replicas(tiny_sentinel_checkpoint, redis, tmp_path_factory):
    logs = tmp_path_factory.mktemp("replicas")
    started = [start_replica(tiny_sentinel_checkpoint, redis.url, logs) for _ in range(2)]
    try:  # stopped even when one never gets ready
        for url, process in started:
            wait_ready(url, [process])
        yield [url for url, _ in started]
    finally:
        for _, process in started:
            process.terminate()
            process.wait(30)


def cache_hits(url: str) -> float:
    found = re.search(r'nmt_cache_lookups_total\{result="hit"\} (\S+)', httpx.get(f"{url}/metrics").text)
    return float(found.group(1)) if found else 0.0


def test_what_one_replica_stores_the_other_serves(replicas):
    a, b = replicas
    body = {"text": "Open the file.", "source": "en", "target": "de", "alignments": True, "max_length": 6}
    made = httpx.post(f"{a}/v1/translate", json=body).json()["translations"][0]
    fetched = httpx.get(f"{b}/v1/alignments/{made['alignment_id']}")
    assert fetched.status_code == 200, fetched.text
    assert fetched.json()["model"] == "en-de" and fetched.json()["source_tokens"][-1] == "</s>"

    url = httpx.post(f"{a}/translate_file", files={"file": ("notes.txt", b"Open the file.\n")},
                     data={"source": "en", "target": "de"}).json()["translatedFileUrl"]
    download = httpx.get(b + url[url.index("/download_file/"):])
    assert download.status_code == 200 and "notes_de.txt" in download.headers["content-disposition"]


def test_the_cache_hits_across_replicas(replicas):
    a, b = replicas
    text = {"q": "Save your changes before you close the window.", "source": "en", "target": "de"}
    before = cache_hits(b)
    first = httpx.post(f"{a}/translate", json=text).json()["translatedText"]
    assert httpx.post(f"{b}/translate", json=text).json()["translatedText"] == first
    assert cache_hits(b) == before + 1
    other_options = httpx.post(f"{b}/translate", json={**text, "alternatives": 1})  # another beam / n-best: decoded
    assert other_options.status_code == 200 and cache_hits(b) == before + 1


def test_a_keys_limit_is_shared(replicas, redis):
    a, b = replicas
    RedisKeyStore(redis.url).add(3, "shared-three")
    send = lambda url: httpx.post(f"{url}/translate", json={"q": "Print.", "source": "en", "target": "de",  # noqa: E731
                                                             "api_key": "shared-three"})
    assert [send(a).status_code, send(b).status_code, send(a).status_code] == [200, 200, 200]
    refused = send(b)
    assert refused.status_code == 429 and refused.json() == {"error": "Slowdown: 3 per 1 minute"}
    assert httpx.post(f"{a}/translate", json={"q": "Print.", "source": "en", "target": "de",
                                              "api_key": "no-such-key"}).status_code == 403


def test_racing_requests_on_two_replicas_never_pass_the_limit_together(redis):
    """Two replicas' limiters (each its own Redis connection) admitting 40 requests at once, a
    limit of 7: exactly 7 pass, and the refused ones are not counted."""
    import asyncio

    from app.limits import RateLimiter
    from app.storage import RedisStorage

    async def race():
        stores = [RedisStorage(redis.url, prefix="race:"), RedisStorage(redis.url, prefix="race:")]
        limiters = [RateLimiter(store, clock=lambda: 6000.0) for store in stores]  # the start of a minute
        answers = await asyncio.gather(*(limiters[i % 2].admit("key:racer", 7) for i in range(40)))
        counted = await stores[0].add("limit:key:racer:100", 0, 120)
        for store in stores:
            await store.close()
        return answers, counted

    answers, counted = asyncio.run(race())
    assert sum(answer is None for answer in answers) == 7 and counted == 7


def test_batched_reads_and_writes_in_one_round_trip(redis):
    """The cache reads and writes a request's sentences with one MGET and one pipeline."""
    import asyncio

    from app.storage import RedisStorage

    async def both():
        store = RedisStorage(redis.url, budgets={"cache": 10}, prefix="batch:")
        await store.put_many({"cache:a": b"1", "cache:b": b"22", "cache:big": b"x" * 11}, ttl_s=60)
        found = await store.get_many(["cache:b", "cache:none", "cache:a", "cache:big"])
        await store.close()
        return found

    assert asyncio.run(both()) == [b"22", None, b"1", None]  # over its kind's budget: not stored


def test_glossaries_in_a_hash_per_key_those_of_the_one_hash_moved_there(redis):
    """Listing one key's glossaries reads that key's hash alone (another key's, here broken,
    is never read: it could hold every other key's megabytes), and glossaries that an earlier
    version kept in the one hash `nmt:glossaries` are moved to their keys' hashes, none lost."""
    import redis as redis_client

    from app.glossaries import RedisGlossaryStore, _record, new_glossary, owner_of

    client = redis_client.from_url(redis.url)
    alice, bob = owner_of("alice"), owner_of("bob")
    old = [new_glossary(f"old {i}", "en", "de", {"file": f"Akte {i}"}, owner) for i, owner in
           enumerate([alice, bob, alice, ""])]
    client.hset("nmt:glossaries", mapping={g.glossary_id: _record(g) for g in old})
    store = RedisGlossaryStore(redis.url)
    assert [g.name for g in store.list(alice)] == ["old 0", "old 2"] and not client.exists("nmt:glossaries")
    assert [g.entries for g in store.list("")] == [{"file": "Akte 3"}]
    assert store.get(old[1].glossary_id, bob).entries == {"file": "Akte 1"}
    assert store.get(old[1].glossary_id, alice) is None and not store.delete(old[1].glossary_id, alice)
    new = new_glossary("new", "en", "de", {"save": "sichern"}, alice)
    store.put(new)
    client.hset(f"nmt:glossaries:{bob}", "broken", "not JSON")
    assert [g.name for g in store.list(alice)] == ["old 0", "old 2", "new"]
    assert store.delete(new.glossary_id, alice) and store.get(new.glossary_id, alice) is None
    assert set(client.hkeys(f"nmt:glossaries:{alice}")) == {old[0].glossary_id.encode(), old[2].glossary_id.encode()}
    store.close()


def test_redis_stopped_and_restarted_mid_test(replicas, redis):
    a, b = replicas
    made = httpx.post(f"{a}/v1/translate", json={"text": "Close the window.", "source": "en", "target": "de",
                                                  "alignments": True, "max_length": 6}).json()
    alignment_id = made["translations"][0]["alignment_id"]
    redis.stop()
    try:
        # translation keeps working (without the cache and the shared limits)
        r = httpx.post(f"{b}/translate", json={"q": "Open the window.", "source": "en", "target": "de"})
        assert r.status_code == 200, r.text
        # what needs the store says so, with a 503, never a 500
        gone = httpx.get(f"{b}/v1/alignments/{alignment_id}")
        assert gone.status_code == 503 and "shared store" in gone.json()["error"]
        stored = httpx.post(f"{a}/v1/translate", json={"text": "Hi.", "source": "en", "target": "de",
                                                        "alignments": True, "max_length": 4})
        assert stored.status_code == 503
        file = httpx.post(f"{a}/translate_file", files={"file": ("a.txt", b"Hi.")},
                          data={"source": "en", "target": "de"})
        assert file.status_code == 503
        ready = httpx.get(f"{a}/ready")
        assert ready.status_code == 200 and ready.json()["storage"] == "the shared store is unavailable"
        assert 'nmt_storage_errors_total{use="cache"}' in httpx.get(f"{b}/metrics").text
    finally:
        redis.start()
    # the append-only file brought back what was stored before the restart
    back = httpx.get(f"{b}/v1/alignments/{alignment_id}")
    assert back.status_code == 200, back.text
    assert httpx.get(f"{a}/ready").json()["storage"] == "ok"
    assert RedisKeyStore(redis.url).lookup("shared-three") is not None
    # a quick restart, with nothing asked while Redis was away: the first call on each replica's
    # pooled (now dead) connection is retried on a new one, not answered with a 503
    assert all(httpx.get(f"{url}/v1/alignments/{alignment_id}").status_code == 200 for url in (a, b))
    redis.stop()
    redis.start()
    assert [httpx.get(f"{url}/v1/alignments/{alignment_id}").status_code for url in (a, b)] == [200, 200]
