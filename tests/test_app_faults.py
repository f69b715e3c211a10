"""Faults over real HTTP (uvicorn in a thread): a worker that raises, hangs past the deadline,
dies; a client that leaves. Faults come from NMT_FAULT_INJECTION's magic words (app/pipe.py)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from app.main import create_app
from app.pipe import FAULT_EXIT, FAULT_RAISE, FAULT_SLOW
from app.settings import Settings
from model.translator import Translator

pytestmark = pytest.mark.e2e

TIMEOUT_S = 2.0  # the request deadline: above a tiny model's batch on a busy machine, below FAULT_SLOW_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


RUNNING: dict[str, bool] = {}  # server url -> whether its workers keep running batches


@pytest.fixture(scope="module", params=["false", "true"], ids=["batch by batch", "running batches"])
def url(tiny_checkpoint, request):
    settings = Settings(model_dirs=[str(tiny_checkpoint)], workers=1, threads_per_worker=1, fault_injection=True, cache=False,
                        request_timeout_s=TIMEOUT_S, max_wait_ms=30, dtype="float32", running_batch=request.param)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    RUNNING[base] = request.param == "true"
    wait_until(lambda: server.started)
    wait_until(lambda: httpx.get(f"{base}/ready").status_code == 200)
    yield base
    server.should_exit = True
    thread.join(30)


def worker(url) -> dict:
    return httpx.get(f"{url}/ready").json()["workers"][0]


def idle(url) -> bool:
    return worker(url)["state"] == "idle"


def body(text):
    return {"text": text, "source": "en", "target": "de", "beam_size": 2}


def test_a_worker_exception_fails_only_the_request_with_the_bad_input(url, tiny_checkpoint):
    texts = ["Hello world.", "Open the file.", f"{FAULT_RAISE} now", "Save your changes.", "Click the button."]

    async def fire():
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/translate", json=body(t)) for t in texts))

    responses = asyncio.run(fire())
    assert responses[2].status_code == 503
    assert "injected fault" in responses[2].json()["error"]
    offline = Translator.load(tiny_checkpoint, device="cpu", dtype="float32")
    expected = offline.translate([t for i, t in enumerate(texts) if i != 2], beam_size=2)
    good = [r for i, r in enumerate(responses) if i != 2]
    assert all(r.status_code == 200 for r in good), [r.text for r in good]
    assert [r.json()["translations"][0]["text"] for r in good] == [e.hypotheses[0].text for e in expected]
    ready = httpx.get(f"{url}/ready")
    assert ready.status_code == 200 and ready.json()["workers"][0]["restarts"] == 0  # no restart needed


def test_deadline_is_504(url):
    r = httpx.post(f"{url}/v1/translate", json=body(FAULT_SLOW), timeout=30)
    assert r.status_code == 504 and "NMT_REQUEST_TIMEOUT_S" in r.json()["error"]
    wait_until(lambda: idle(url))
    assert httpx.post(f"{url}/v1/translate", json=body("Hello."), timeout=30).status_code == 200


def test_a_client_that_leaves_before_its_batch_runs_is_not_computed(url):
    wait_until(lambda: idle(url))
    before, cancelled_before = worker(url)["batches"], worker(url)["cancelled"]

    async def scenario():
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            slow = asyncio.create_task(client.post("/v1/translate", json=body(FAULT_SLOW)))  # holds the worker FAULT_SLOW_S
            await asyncio.sleep(0.15)
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/v1/translate", json=body("Open the file."), timeout=0.2)
            return await slow

    assert asyncio.run(scenario()).status_code == 504
    wait_until(lambda: idle(url))
    time.sleep(0.1)
    if not RUNNING[url]:  # it never left the queue
        assert worker(url)["batches"] == before + 1  # only the slow batch ran
    else:  # both went to the worker at once, and it dropped both before their first step
        assert worker(url)["batches"] == before + 2 and worker(url)["cancelled"] == cancelled_before + 2
    assert 'route="/v1/translate",status="499"' in httpx.get(f"{url}/metrics").text


def test_a_crashed_worker_fails_its_request_and_is_replaced(url):
    r = httpx.post(f"{url}/v1/translate", json=body(FAULT_EXIT), timeout=30)
    assert r.status_code == 503 and "exited (exit code 3)" in r.json()["error"]
    ready = httpx.get(f"{url}/ready")
    assert ready.status_code == 503 and "restarting" in ready.json()["reason"]  # the replacement is loading
    wait_until(lambda: httpx.get(f"{url}/ready").status_code == 200)
    assert worker(url)["restarts"] == 1
    assert httpx.post(f"{url}/v1/translate", json=body("Hello."), timeout=30).status_code == 200
