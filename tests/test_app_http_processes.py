"""`nmt serve` with NMT_HTTP_PROCESSES=2: two real HTTP processes in front of one engine process
(app/engine.py, app/serve.py), sharing a real redis-server. They translate as one process does,
one's alignments are the other's, /metrics sums every process, a queue-full engine answers 429
through them, the engine process's one language detector answers for both, a request given up
there is dropped by the engine, the engine killed is started
again (its workers do not outlive it) while /health keeps answering, SIGTERM finishes the
request in flight before the engine stops, and `nmt serve` killed outright leaves nothing behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.engine import STATUS_INTERVAL_S
from app.settings import Settings
from tests.conftest import ready_client, wait_ready
from tests.test_app_e2e import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("redis-server") is None,
                                                  reason="needs redis-server (apt-get install redis-server)")]

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "checkpoints" / "en-de"  # a trained model: different texts get different translations
TEXTS = [f"Open the file number {i} and save it." if i % 2 else f"Print page {i}." for i in range(24)]


def start(checkpoint: Path, redis_url: str, logs: Path, **settings: str) -> tuple[str, subprocess.Popen]:
    port = free_port()
    env = {**os.environ, "NMT_HTTP_PROCESSES": "2", "NMT_MODEL_DIRS": str(checkpoint), "NMT_WORKERS": "1",
           "NMT_THREADS_PER_WORKER": "1", "NMT_DTYPE": "float32", "NMT_REDIS_URL": redis_url,
           "NMT_DETECT_LANGUAGES": "none", "NMT_CACHE": "false", **settings}
    log = logs / f"nmt-http-processes-{port}.log"  # wait_ready shows its tail on a failure
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "nmt", "serve", "--host", "127.0.0.1", "--port", str(port)],
                                   cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    process.log = log
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, [process])
    except BaseException:
        stop(process)
        raise
    return url, process


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(60)


def children(pid: int) -> list[int]:
    """pid's child processes, multiprocessing's resource tracker left out."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return [c for c in found if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(redis, tmp_path_factory):
    logs = tmp_path_factory.mktemp("http-processes")
    url, process = start(SHIPPED, redis.url, logs, NMT_DETECT_LANGUAGES="en,de,fr")
    yield url, process
    stop(process)


def test_two_http_processes_translate_as_one_process_does(server):
    url, process = server
    http_processes = [p for p in children(process.pid) if not children(p)]  # the engine has its workers
    assert len(http_processes) == 2, children(process.pid)
    body = lambda text: {"text": text, "source": "en", "target": "de", "max_length": 12}  # noqa: E731
    answers: dict[int, object] = {}

    def send(i: int) -> None:  # a connection each, at once: the kernel hands them to either process
        with httpx.Client(base_url=url, timeout=60) as http:
            answers[i] = http.post("/v1/translate", json=body(TEXTS[i]))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(TEXTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(answers[i].status_code == 200 for i in answers), [answers[i].text for i in answers]
    settings = Settings(model_dirs=[str(SHIPPED)], workers=1, threads_per_worker=1, dtype="float32",
                        detect_languages=["none"], cache=False)
    with ready_client(settings) as alone:  # one process doing everything, as by default
        expected = [alone.post("/v1/translate", json=body(text)).json()["translations"][0] for text in TEXTS]
    got = [answers[i].json()["translations"][0] for i in range(len(TEXTS))]
    assert len({e["text"] for e in expected}) == len(TEXTS)  # (so that an answer given to another request would show)
    assert [g["text"] for g in got] == [e["text"] for e in expected]
    # (scores move a little with the batch: its vocabulary shortlist is the union of its sentences')
    assert [g["score"] for g in got] == pytest.approx([e["score"] for e in expected], abs=0.02)


def test_one_processs_alignments_are_the_others(server):
    url, _ = server
    made = httpx.post(f"{url}/v1/translate", json={"text": "Open the file.", "source": "en", "target": "de",
                                                   "alignments": True, "max_length": 6}).json()
    alignment_id = made["translations"][0]["alignment_id"]
    for _ in range(12):  # a new connection each: both processes answer some
        fetched = httpx.get(f"{url}/v1/alignments/{alignment_id}")
        assert fetched.status_code == 200 and fetched.json()["model"] == "en-de", fetched.text


def test_one_language_detector_in_the_engine_process_answers_for_every_http_process(server):
    """/detect and source 'auto' through either HTTP process, neither of which loads the detector
    (~1.2 GB with every language): the engine process holds the one copy."""
    url, process = server
    engine = next(p for p in children(process.pid) if children(p))
    http_processes = [p for p in children(process.pid) if not children(p)]
    texts = ["Das ist ein schönes Haus, und wir wohnen sehr gern darin.", "C'est une belle maison et nous y habitons.",
             "This is a nice house and we like living in it.", "1234 ..."]
    for _ in range(6):  # new connections: both processes answer some
        found = httpx.post(f"{url}/detect", json={"q": texts}, timeout=30)
        assert found.status_code == 200, found.text
        assert [answer[0]["language"] if answer else None for answer in found.json()] == ["de", "fr", "en", None]
        auto = httpx.post(f"{url}/translate", json={"q": texts[2], "source": "auto", "target": "de"}, timeout=30)
        assert auto.status_code == 200 and auto.json()["detectedLanguage"]["language"] == "en", auto.text
        french = httpx.post(f"{url}/translate", json={"q": texts[1], "source": "auto", "target": "de"}, timeout=30)
        assert french.status_code == 400 and "French" in french.text, french.text

    def maps_lingua(pid: int) -> bool:
        return "lingua" in Path(f"/proc/{pid}/maps").read_text()

    assert maps_lingua(engine) and not any(maps_lingua(p) for p in http_processes)


def test_ready_and_metrics_speak_for_every_process(server):
    url, _ = server
    ready = httpx.get(f"{url}/ready").json()
    assert ready["ready"] and [w["state"] for w in ready["workers"]] in (["idle"], ["busy"]), ready
    assert httpx.get(f"{url}/v1/models").json()["models"][0]["dtype"] == "float32"

    def requests_counted() -> float:
        text = httpx.get(f"{url}/metrics").text
        return sum(float(v) for v in re.findall(r'nmt_requests_total\{method="GET",route="/health",status="200"\} (\S+)',
                                                text))

    before = requests_counted()
    for _ in range(10):  # new connections: both processes answer some, and each counts its own
        assert httpx.get(f"{url}/health").status_code == 200
    assert requests_counted() == before + 10
    text = httpx.get(f"{url}/metrics").text
    assert re.search(r"^nmt_workers_alive 1\.0$", text, re.M), text  # the engine's gauge, set by the engine process
    assert re.search(r"^nmt_batch_size_count [1-9]", text, re.M)  # the engine's batches


def test_a_killed_engine_is_started_again_and_its_workers_go_with_it(server):
    url, process = server
    engine = next(p for p in children(process.pid) if children(p))
    workers = children(engine)
    os.kill(engine, signal.SIGKILL)
    deadline, refused = time.monotonic() + 60, False
    while True:  # /health answers throughout; translations fail with 503 (not 500) until it is back
        assert httpx.get(f"{url}/health").status_code == 200
        ready = httpx.get(f"{url}/ready")
        answer = httpx.post(f"{url}/v1/translate", json={"text": "Print.", "source": "en", "target": "de"})
        assert answer.status_code in (200, 503), answer.text
        if ready.status_code == 503:
            refused = True
            assert any(word in ready.json()["reason"] for word in ("engine", "worker", "detector")), ready.json()
        elif refused and answer.status_code == 200:
            break
        assert time.monotonic() < deadline, "the engine did not come back within 60 s"
        time.sleep(0.05)
    assert not any(alive(w) for w in workers), "the killed engine's workers outlived it"
    assert next(p for p in children(process.pid) if children(p)) != engine


def test_the_engine_refuses_past_its_queue_limit_with_429_and_sigterm_finishes_what_runs(tiny_sentinel_checkpoint,
                                                                                          redis, tmp_path):
    from app.pipe import FAULT_SLOW

    # one address sends all three: its share the whole queue
    url, process = start(tiny_sentinel_checkpoint, redis.url, tmp_path, NMT_FAULT_INJECTION="true",
                         NMT_MAX_QUEUE_ITEMS="1", NMT_MAX_WAIT_MS="0", NMT_CLIENT_SHARE_IN_FLIGHT="1")
    tree = [process.pid] + [p for c in children(process.pid) for p in [c, *children(c)]]
    try:
        answers = {}

        def send(name: str, text: str) -> None:
            answers[name] = httpx.post(f"{url}/v1/translate", json={"text": text, "source": "en", "target": "de"},
                                       timeout=60)

        slow = threading.Thread(target=send, args=("slow", f"Open {FAULT_SLOW}."))  # holds the one worker 4 s
        slow.start()
        time.sleep(1.0)
        queued = threading.Thread(target=send, args=("queued", "Print."))  # the one item the queue takes
        queued.start()
        time.sleep(0.5)
        refused = httpx.post(f"{url}/v1/translate", json={"text": "Save.", "source": "en", "target": "de"})
        assert refused.status_code == 429 and "too busy" in refused.json()["error"], refused.text
        process.send_signal(signal.SIGTERM)  # while both are in flight
        slow.join(60)
        queued.join(60)
        assert answers["slow"].status_code == 200 and answers["queued"].status_code == 200, answers
        process.wait(60)
    finally:
        stop(process)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in tree):
        assert time.monotonic() < deadline, [p for p in tree if alive(p)]
        time.sleep(0.1)


def test_nmt_serve_killed_outright_leaves_no_process_behind(tiny_sentinel_checkpoint, redis, tmp_path):
    """SIGKILL to `nmt serve` itself: its engine stops (its pipe from `nmt serve` closed), and so do
    its HTTP processes (nobody would start the engine again) and the workers: the port is free."""
    url, process = start(tiny_sentinel_checkpoint, redis.url, tmp_path)
    tree = [process.pid] + [p for c in children(process.pid) for p in [c, *children(c)]]
    try:
        process.kill()
        deadline = time.monotonic() + 30
        while any(alive(p) for p in tree):
            assert time.monotonic() < deadline, [p for p in tree if alive(p)]
            time.sleep(0.1)
    finally:
        for p in tree:
            if alive(p):
                os.kill(p, signal.SIGKILL)
        process.wait(10)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health")


def test_without_redis_the_engine_process_keeps_what_one_http_process_stores_for_the_other(
        tiny_sentinel_checkpoint, tmp_path):
    """No NMT_REDIS_URL: alignments, translated files and rate-limit counts live in the engine
    process, so whichever HTTP process a connection reaches serves what the other stored and counts
    what the other counted (counted per process, the limit would let through about twice as many)."""
    limit = 60
    url, process = start(tiny_sentinel_checkpoint, "", tmp_path, NMT_REQ_LIMIT=str(limit))
    try:
        made = httpx.post(f"{url}/v1/translate", json={"text": "Open the file.", "source": "en", "target": "de",
                                                       "alignments": True, "max_length": 6})
        assert made.status_code == 200, made.text
        alignment_id = made.json()["translations"][0]["alignment_id"]
        for _ in range(12):  # a new connection each: both processes answer some
            fetched = httpx.get(f"{url}/v1/alignments/{alignment_id}")
            assert fetched.status_code == 200 and fetched.json()["model"] == "en-de", fetched.text
        translated = httpx.post(f"{url}/translate_file", files={"file": ("notes.txt", b"Open the file.\n")},
                                data={"source": "en", "target": "de"})
        assert translated.status_code == 200, translated.text
        link = translated.json()["translatedFileUrl"]
        for _ in range(8):
            download = httpx.get(url + link[link.index("/download_file/"):])
            assert download.status_code == 200 and "notes_de.txt" in download.headers["content-disposition"]
        counted = 1 + 12 + 1 + 8  # every call so far
        time.sleep(2 * STATUS_INTERVAL_S)  # the engine process sets the store's gauges this often
        metrics = httpx.get(f"{url}/metrics").text
        assert re.search(r"^nmt_alignments_stored 1\.0$", metrics, re.M), metrics
        assert re.search(r"^nmt_translated_file_bytes [1-9]", metrics, re.M), metrics

        statuses = [httpx.post(f"{url}/v1/translate", json={"text": "Print.", "source": "en", "target": "de",
                                                              "max_length": 3}).status_code for _ in range(80)]
        assert set(statuses) == {200, 429}
        # (+-2: the limit's sliding minute, should a minute end meanwhile)
        assert abs(statuses.count(200) - (limit - counted)) <= 2, statuses.count(200)
    finally:
        stop(process)


def test_a_request_given_up_in_its_http_process_is_dropped_by_the_engine(tiny_sentinel_checkpoint, redis, tmp_path):
    """The deadline passes in the HTTP process (504): the engine never decodes the job it had queued."""
    from app.pipe import FAULT_SLOW

    url, process = start(tiny_sentinel_checkpoint, redis.url, tmp_path, NMT_FAULT_INJECTION="true",
                         NMT_REQUEST_TIMEOUT_S="1", NMT_MAX_WAIT_MS="0")
    try:
        answers = {}

        def send(name: str, text: str) -> None:
            answers[name] = httpx.post(f"{url}/v1/translate", json={"text": text, "source": "en", "target": "de"},
                                       timeout=60)

        def batches() -> int:
            return httpx.get(f"{url}/ready").json()["workers"][0]["batches"]

        before = batches()
        slow = threading.Thread(target=send, args=("slow", f"Open {FAULT_SLOW}."))  # holds the one worker 4 s
        slow.start()
        time.sleep(0.5)
        send("queued", "Print the page.")  # waits behind it, past its 1 s deadline
        assert answers["queued"].status_code == 504, answers["queued"].text
        slow.join(60)  # (its own deadline passed too: 504, while the worker still sleeps)
        deadline = time.monotonic() + 20
        while batches() == before:  # until the worker is free again: a job still queued would run now
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1.0)
        assert batches() == before + 1
        assert re.search(r"^nmt_queue_depth 0\.0$", httpx.get(f"{url}/metrics").text, re.M)
    finally:
        stop(process)
