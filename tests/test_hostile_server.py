"""The inputs of issue 44 against a real server (uvicorn, a worker process, the document reader),
with /health polled every 50 ms meanwhile: each gets its answer within a second, and /health never
waits 100 ms. Before, each froze the whole server for seconds (JSON scan, sentence splitter, span
patterns, HTML parser, client-built glossary regexes). And `nmt serve` takes X-Forwarded-For
from nobody unless NMT_TRUST_FORWARDED_FOR says so. And clients that ask for attention and never
read it hold no more of the server's memory than NMT_ATTENTION_IN_FLIGHT_VALUES lets through
(without it, 60 of them grew the server by ~1 GB here). And connections that never finish a request
are closed (NMT_READ_TIMEOUT_S).

Run with `-s` to print the table of answer times and /health's slowest answer (SECURITY.md)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import running_server, wait_ready

pytestmark = pytest.mark.e2e
MiB = 2**20
# the tests of the budgets themselves send from one address, whose share is then the whole budget
ONE_CLIENT_MAY_HOLD_ALL = {"NMT_CLIENT_SHARE_IN_FLIGHT": "1"}


@pytest.fixture(scope="module")
def server(tiny_sentinel_checkpoint):
    with running_server({"NMT_MODEL_DIRS": str(tiny_sentinel_checkpoint), "NMT_WORKERS": "1",
                         "NMT_THREADS_PER_WORKER": "1", "NMT_MAX_WAIT_MS": "2", "NMT_DETECT_LANGUAGES": "en,de",
                         "NMT_CACHE": "false"}) as running:
        yield running[0]


_POLL = """
import sys, time, httpx
with httpx.Client(timeout=30) as client:
    while True:
        start = time.perf_counter()
        client.get(sys.argv[1] + "/health")
        print(time.perf_counter() - start, flush=True)
        time.sleep(0.05)
"""


class HealthPoller:
    """GET /health every 50 ms, from a process of its own (a thread of the test process would
    count the test's own GIL waits as the server's); the answers' times while the block ran."""

    def __init__(self, url: str):
        self.url, self.latencies = url, []

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", _POLL, self.url], stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self) -> None:
        """Stop polling (once) and read what it measured."""
        if self.process.poll() is None:
            time.sleep(0.1)
            self.process.terminate()
            out, _ = self.process.communicate(timeout=30)
            self.latencies = [float(line) for line in out.split()]

    @property
    def slowest(self) -> float:
        return max(self.latencies, default=0.0)

    @property
    def answers(self) -> int:
        return len(self.latencies)


def _json(body) -> dict:
    return {"content": json.dumps(body).encode(), "headers": {"content-type": "application/json"}}


GLOSSARY = {f"term{i} word{i}": f"Begriff{i}" + "x" * 150 for i in range(5000)}  # ~1 MB of JSON
ATTACKS = [  # (name, method, path, request keyword arguments, statuses it may get)
    ("JSON: escaped quotes, then brackets (4 MiB, not JSON)", "/translate",
     {"content": b'\\"' * (2 * MiB - 64) + b"[" * 40, "headers": {"content-type": "application/json"}}, {400}),
    ("a text of 5,000: dots, then words", "/translate",
     _json({"q": "a" + "." * 2500 + " b" * 1249, "source": "en", "target": "de"}), {200, 400}),
    ("64 such texts", "/translate",
     _json({"q": ["a" + "." * 2500 + " b" * 1249] * 64, "source": "en", "target": "de"}), {200, 400}),
    (".txt of 'a' * 200,000", "/translate_file",
     {"files": {"file": ("a.txt", b"a" * 200_000)}, "data": {"source": "en", "target": "de"}}, {400}),
    (".txt of '%' + '0' * 200,000", "/translate_file",
     {"files": {"file": ("a.txt", b"%" + b"0" * 199_999)}, "data": {"source": "en", "target": "de"}}, {200, 400}),
    (".html of '<a ' * 60,000", "/translate_file",
     {"files": {"file": ("a.html", b"<a " * 60_000)}, "data": {"source": "en", "target": "de"}}, {200, 400}),
    ("format html: '<a ' * 1,666 in each of 64 texts", "/translate",
     _json({"q": ["<a " * 1666] * 64, "source": "en", "target": "de", "format": "html"}), {200, 400}),
    ("an inline glossary of 5,000 entries, ~1 MB", "/translate",
     _json({"q": "Open term12 word12 now.", "source": "en", "target": "de", "glossary": GLOSSARY}), {200}),
    ("another one, other terms", "/v1/translate",
     _json({"text": "Open term13 word13 now.", "source": "en", "target": "de",
            "glossary": {k + "y": v for k, v in GLOSSARY.items()}}), {200}),
]


def test_each_attack_is_answered_within_a_second_and_health_within_100_ms(server):
    rows = []
    with httpx.Client(timeout=120) as client:
        for name, path, kwargs, statuses in ATTACKS:
            with HealthPoller(server) as health:
                start = time.perf_counter()
                response = client.post(f"{server}{path}", **kwargs)
                took = time.perf_counter() - start
            rows.append((name, response.status_code, took, health.slowest))
            assert response.status_code in statuses, (name, response.text[:300])
    print("\n| input | status | answered in | /health slowest meanwhile |\n|---|---:|---:|---:|")
    for name, status, took, slowest in rows:
        print(f"| {name} | {status} | {took:.3f} s | {slowest * 1000:.0f} ms |")
    assert all(took < 1.0 for _, _, took, _ in rows), rows
    assert all(slowest < 0.1 for _, _, _, slowest in rows), rows


def test_nmt_serve_counts_limits_by_the_peer_not_by_x_forwarded_for(tiny_sentinel_checkpoint):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "NMT_MODEL_DIRS": str(tiny_sentinel_checkpoint), "NMT_WORKERS": "1",
           "NMT_THREADS_PER_WORKER": "1", "NMT_REQ_LIMIT": "2", "NMT_DETECT_LANGUAGES": "none", "NMT_CACHE": "false"}
    process = subprocess.Popen([sys.executable, "-c", "from nmt.cli import main; main()", "serve", "--port", str(port)],
                               cwd=Path(__file__).resolve().parents[1], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, [process])
        body = {"q": "Open the file.", "source": "en", "target": "de"}
        assert [httpx.post(f"{url}/translate", json=body).status_code for _ in range(3)] == [200, 200, 429]
        forged = httpx.post(f"{url}/translate", json=body, headers={"x-forwarded-for": "203.0.113.9"})
        assert forged.status_code == 429, "a client chose its own address with X-Forwarded-For"
    finally:
        process.terminate()
        process.wait(30)


def raw_post(path: str, body: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (path.encode(), len(body))) + body


def send_and_never_read(port: int, request: bytes, address: str = "127.0.0.1") -> socket.socket:
    """A connection from `address` that sends `request` and reads nothing (a receive buffer of 4 KiB)."""
    connection = socket.create_connection(("127.0.0.1", port), source_address=(address, 0))
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    connection.sendall(request)
    return connection


def peak_while(pid: int, seconds: float, peak: int) -> int:
    """The process tree's largest resident size over `seconds`, sampled every 50 ms, and `peak`."""
    from tests.test_untrusted_server import tree_rss

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, tree_rss(pid))
        time.sleep(0.05)
    return peak


def statuses_of(connections: list[socket.socket]) -> list[bytes]:
    """The status code each connection's answer starts with."""
    out = []
    for connection in connections:
        connection.settimeout(60)
        out.append(connection.recv(12).split(b" ")[1])
    return out


def test_clients_that_never_read_their_attention_hold_no_more_than_the_budget(tiny_sentinel_checkpoint):
    """60 connections each ask for the attention of 16 long texts (~14 MB of JSON) and read
    nothing: past NMT_ATTENTION_IN_FLIGHT_VALUES they get 429 at once, so the server grows by what
    the budget lets through (here two or three answers), not by what 60 unread answers would hold;
    /health keeps answering meanwhile (app/in_flight.py)."""
    from tests.test_untrusted_server import tree_rss

    text = " ".join(["Open the file and save it now."] * 5)  # ~110 of the tiny model's 128 positions
    body = json.dumps({"text": [text] * 16, "source": "en", "target": "de", "beam_size": 1, "max_length": 128,
                       "include_attention": True}).encode()
    with running_server({"NMT_MODEL_DIRS": str(tiny_sentinel_checkpoint), "NMT_WORKERS": "1",
                         "NMT_THREADS_PER_WORKER": "1", "NMT_DETECT_LANGUAGES": "en,de", "NMT_CACHE": "false",
                         "NMT_ATTENTION_IN_FLIGHT_VALUES": "4000000", **ONE_CLIENT_MAY_HOLD_ALL}) as (url, process):
        one = httpx.post(f"{url}/v1/translate", content=body, headers={"content-type": "application/json"}, timeout=60)
        assert one.status_code == 200, one.text[:300]
        answer_bytes = len(one.content)
        assert answer_bytes > 8 * MiB  # more than the kernel's socket buffers take off the server
        port, request = int(url.rsplit(":", 1)[1]), raw_post("/v1/translate", body)
        before, connections = tree_rss(process.pid), []
        try:
            with HealthPoller(url) as health:
                connections += [send_and_never_read(port, request) for _ in range(60)]
                peak = peak_while(process.pid, 8, 0)
            statuses = statuses_of(connections)
        finally:
            for connection in connections:
                connection.close()
        print(f"\n60 unread attention requests: {statuses.count(b'200')} answered, {statuses.count(b'429')} "
              f"refused; server tree +{(peak - before) / MiB:.0f} MiB (one answer {answer_bytes / MiB:.1f} MiB); "
              f"/health slowest {1000 * health.slowest:.0f} ms of {health.answers}")
        assert statuses.count(b"429") >= 55 and statuses.count(b"200") + statuses.count(b"429") == 60
        assert peak - before < 10 * answer_bytes  # 60 unread answers would hold 60 x that
        assert health.answers >= 20 and health.slowest < 1.0


def test_an_answer_nobody_reads_holds_its_reservation_until_the_send_timeout_cuts_it_off(tiny_sentinel_checkpoint):
    """Clients that arrive one after another, each after the answers before it were written, and
    read nothing: the server hands a body on as its client reads it, so an unread answer keeps its
    reservation (later ones get 429) and its memory only until NMT_SEND_TIMEOUT_S cuts it off;
    then requests pass again. (Given whole, every such answer was written at once into the
    connection's buffer, released, and kept there: all 200, the server growing by each.)"""
    from tests.test_untrusted_server import tree_rss

    text = " ".join(["Open the file and save it now."] * 5)
    body = json.dumps({"text": [text] * 16, "source": "en", "target": "de", "beam_size": 1, "max_length": 128,
                       "include_attention": True}).encode()
    timeout_s = 2
    with running_server({"NMT_MODEL_DIRS": str(tiny_sentinel_checkpoint), "NMT_WORKERS": "1",
                         "NMT_THREADS_PER_WORKER": "1", "NMT_DETECT_LANGUAGES": "en,de", "NMT_CACHE": "false",
                         "NMT_ATTENTION_IN_FLIGHT_VALUES": "4000000", **ONE_CLIENT_MAY_HOLD_ALL,
                         "NMT_SEND_TIMEOUT_S": str(timeout_s)}) as (url, process):
        post = lambda: httpx.post(f"{url}/v1/translate", content=body,  # noqa: E731
                                  headers={"content-type": "application/json"}, timeout=60)
        answer_bytes = len(post().content)
        port, request = int(url.rsplit(":", 1)[1]), raw_post("/v1/translate", body)
        before, peak, connections = tree_rss(process.pid), 0, []
        try:
            for _ in range(16):
                connections.append(send_and_never_read(port, request))
                peak = peak_while(process.pid, 0.3, peak)
            statuses = statuses_of(connections)
            time.sleep(timeout_s + 1)
            after = post()  # the unread connections are still open, their reservations gone
        finally:
            for connection in connections:
                connection.close()
        print(f"\n16 unread attention requests 0.3 s apart: {statuses.count(b'200')} answered, "
              f"{statuses.count(b'429')} refused; server tree +{(peak - before) / MiB:.0f} MiB (one answer "
              f"{answer_bytes / MiB:.1f} MiB)")
        assert statuses.count(b"429") >= 4 and statuses.count(b"200") >= 4, statuses
        assert peak - before < 8 * answer_bytes  # 16 kept answers would hold 16 x that, and more
        assert after.status_code == 200, after.text[:300]


def test_connections_that_never_finish_a_request_are_closed(tiny_sentinel_checkpoint):
    """Slowloris: connections that send nothing, half a request head, or half a body hold a file
    descriptor each for as long as they are open, and uvicorn alone never closes them. `nmt serve`
    closes a connection whose head has not arrived within NMT_READ_TIMEOUT_S, answers a body that
    stops arriving with 408, and a head past NMT_MAX_HEAD_BYTES with 431 (uvicorn held a header or
    URL of any size until it ended); /health answers meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "NMT_MODEL_DIRS": str(tiny_sentinel_checkpoint), "NMT_WORKERS": "1",
           "NMT_THREADS_PER_WORKER": "1", "NMT_DETECT_LANGUAGES": "none", "NMT_READ_TIMEOUT_S": "1"}
    process = subprocess.Popen([sys.executable, "-c", "from nmt.cli import main; main()", "serve", "--port", str(port)],
                               cwd=Path(__file__).resolve().parents[1], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    openings = {"nothing": b"",
                "half a head": b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n",
                "half a body": b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 100\r\n\r\n{\"q\": \"Open",
                "half a file": b"POST /translate_file HTTP/1.1\r\nHost: test\r\nContent-Type: multipart/form-data; "
                               b"boundary=b\r\nContent-Length: 1000\r\n\r\n--b\r\n",
                "a header of 1 MiB": b"GET /health HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * MiB,
                "a URL of 1 MiB": b"GET /health?" + b"a" * MiB}
    connections: list[tuple[str, socket.socket]] = []
    try:
        wait_ready(url, [process])
        descriptors = len(os.listdir(f"/proc/{process.pid}/fd"))
        with HealthPoller(url) as health:
            for _ in range(100):
                for name, opening in openings.items():
                    connection = socket.create_connection(("127.0.0.1", port))
                    with contextlib.suppress(ConnectionError):  # a head past the limit is cut off while sent
                        connection.sendall(opening)
                    connections.append((name, connection))
            time.sleep(0.5)
            held = len(os.listdir(f"/proc/{process.pid}/fd")) - descriptors
            answers: dict[str, set[bytes]] = {name: set() for name in openings}
            deadline = time.monotonic() + 10
            for name, connection in connections:
                connection.settimeout(max(0.1, deadline - time.monotonic()))
                received = b""
                with contextlib.suppress(ConnectionResetError):
                    while chunk := connection.recv(4096):  # until the server closes it (a timeout fails the test)
                        received += chunk
                answers[name].add(received.split(b"\r\n", 1)[0] + (b" " + received[-60:] if received else b""))
        left = len(os.listdir(f"/proc/{process.pid}/fd")) - descriptors
        print(f"\n600 connections that never finish a request: {held} descriptors held at 0.5 s, {left} after; "
              f"/health slowest {1000 * health.slowest:.0f} ms of {health.answers}")
        assert held >= 350 and left < 10
        assert answers["nothing"] == {b""} and answers["half a head"] == {b""}
        for name in ("a header of 1 MiB", "a URL of 1 MiB"):  # refused once past NMT_MAX_HEAD_BYTES, not held
            assert all(a.startswith(b"HTTP/1.1 431") and b"(NMT_MAX_HEAD_BYTES)" in a or a == b""
                       for a in answers[name]), answers[name]
            assert any(a.startswith(b"HTTP/1.1 431") for a in answers[name]), answers[name]
        for name in ("half a body", "half a file"):
            [answer] = answers[name]
            assert answer.startswith(b"HTTP/1.1 408") and b"(NMT_READ_TIMEOUT_S)" in answer, answer
        assert health.answers >= 20 and health.slowest < 0.5
    finally:
        for _, connection in connections:
            connection.close()
        process.terminate()
        process.wait(30)


def test_bodies_held_back_by_many_connections_stay_within_the_budget(tiny_sentinel_checkpoint):
    """Connections that each send most of a body and hold back its end keep what they sent in the
    server until the body is complete; NMT_BODY_BYTES_IN_FLIGHT bounds them together (503 past it,
    the connection closed): large bodies within the budget, while small requests still go through;
    small ones (up to 64 KiB) within a quarter more (app/body_limit.py)."""
    from tests.test_untrusted_server import tree_rss

    def hold_back(size: int, count: int) -> list[socket.socket]:  # bodies of `size` sent but their last 10 bytes
        body = json.dumps({"q": "a" * size, "source": "en", "target": "de"}).encode()
        held_back = raw_post("/translate", body)[:-10]
        out = []
        for _ in range(count):
            out.append(socket.create_connection(("127.0.0.1", port)))
            with contextlib.suppress(ConnectionError):  # refused while sending: its 503 may still be there
                out[-1].sendall(held_back)
        return out

    def statuses(connections: list[socket.socket]) -> list[bytes]:
        out = []
        for connection in connections:  # an answer is there by now, or none will come
            connection.settimeout(0.05)
            try:
                out.append(connection.recv(12)[9:12] or b"closed")
            except TimeoutError:
                out.append(b"held")
            except ConnectionError:
                out.append(b"reset")
        return out

    with running_server({"NMT_MODEL_DIRS": str(tiny_sentinel_checkpoint), "NMT_WORKERS": "1",
                         "NMT_THREADS_PER_WORKER": "1", "NMT_DETECT_LANGUAGES": "none",
                         "NMT_BODY_BYTES_IN_FLIGHT": str(8 * MiB), **ONE_CLIENT_MAY_HOLD_ALL}) as (url, process):
        port = int(url.rsplit(":", 1)[1])
        before, large, small_bodies = tree_rss(process.pid), [], []
        try:
            large = hold_back(MiB, 30)
            time.sleep(1)
            grown = tree_rss(process.pid) - before
            small = httpx.post(f"{url}/translate", json={"q": "Open the file.", "source": "en", "target": "de"})
            large_statuses = statuses(large)
            small_bodies = hold_back(60 * 1024, 150)  # 9 MiB of small bodies beside the large ones held
            time.sleep(1)
            small_statuses = statuses(small_bodies)
        finally:
            for connection in large + small_bodies:
                connection.close()
        print(f"\n30 bodies of 1 MiB held 10 bytes short, a budget of 8 MiB: {large_statuses.count(b'held')} held, "
              f"{large_statuses.count(b'503')} answered 503, the others closed; server tree +{grown / MiB:.0f} MiB; "
              f"then 150 of 60 KiB: {small_statuses.count(b'held')} held, {small_statuses.count(b'503')} 503")
        assert 4 <= large_statuses.count(b"held") <= 9, large_statuses
        assert large_statuses.count(b"503") >= 10, large_statuses
        assert grown < 40 * MiB
        assert small.status_code == 200, small.text
        assert 5 <= small_statuses.count(b"held") <= 60, small_statuses  # ~2-3 MiB of the quarter more
        assert small_statuses.count(b"503") >= 50, small_statuses


@pytest.mark.parametrize("share", ["0.25", "1"])
def test_one_client_address_holds_at_most_its_share_of_what_requests_in_flight_may_hold(tiny_sentinel_checkpoint,
                                                                                         share):
    """One address holding back large bodies, or leaving attention unread, fills at most its share
    (NMT_CLIENT_SHARE_IN_FLIGHT) of the bodies' and the attention's budgets: another address's
    large request still goes through, and its own attention request too. With the share the whole
    budget ("1"), the same attacker fills the budget and the others get 503 and 429."""
    bodies = 12 * [raw_post("/translate", json.dumps({"q": "a" * MiB, "source": "en", "target": "de"}).encode())[:-10]]
    text = " ".join(["Open the file and save it now."] * 5)
    attention = json.dumps({"text": [text] * 16, "source": "en", "target": "de", "beam_size": 1, "max_length": 128,
                            "include_attention": True}).encode()
    large = json.dumps({"q": "Open the file.", "source": "en", "target": "de"}).encode() + b" " * MiB
    with running_server({"NMT_MODEL_DIRS": str(tiny_sentinel_checkpoint), "NMT_WORKERS": "1",
                         "NMT_THREADS_PER_WORKER": "1", "NMT_DETECT_LANGUAGES": "none", "NMT_CACHE": "false",
                         "NMT_BODY_BYTES_IN_FLIGHT": str(8 * MiB), "NMT_ATTENTION_IN_FLIGHT_VALUES": "4000000",
                         "NMT_CLIENT_SHARE_IN_FLIGHT": share}) as (url, process):
        port, held = int(url.rsplit(":", 1)[1]), []
        other = httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=60)
        try:
            for body in bodies:
                with contextlib.suppress(ConnectionError):  # refused while sending: its answer may still be there
                    held.append(send_and_never_read(port, body))
            time.sleep(0.5)
            body_statuses = []
            for connection in held:  # an answer is there by now, or none will come
                connection.settimeout(0.05)
                try:
                    body_statuses.append(connection.recv(200).split(b" ")[1])
                except TimeoutError:
                    body_statuses.append(b"held")
            large_answer = other.post("/translate", content=large, headers={"content-type": "application/json"})
            unread = [send_and_never_read(port, raw_post("/v1/translate", attention)) for _ in range(6)]
            attacker = statuses_of(unread)  # each answered or refused; the answered hold their reservations
            attention_answer = other.post("/v1/translate", content=attention,
                                          headers={"content-type": "application/json"})
        finally:
            for connection in held + unread:
                connection.close()
            other.close()
    print(f"\nshare {share}: the attacker's 12 bodies of 1 MiB held 10 bytes short: {body_statuses.count(b'held')} held, "
          f"{body_statuses.count(b'429')} x 429, {body_statuses.count(b'503')} x 503; another address's 1 MiB request "
          f"{large_answer.status_code}; the attacker's 6 unread attention requests {attacker}, then the other "
          f"address's {attention_answer.status_code}")
    if share == "1":
        assert body_statuses.count(b"held") >= 6, body_statuses
        assert large_answer.status_code == 503, large_answer.text
        assert attacker.count(b"200") >= 2 and attention_answer.status_code == 429
    else:  # a quarter: 2 MiB of bodies, 1,000,000 attention values, less than one request's bound
        assert body_statuses.count(b"held") <= 2 and body_statuses.count(b"429") >= 10, body_statuses
        assert large_answer.status_code == 200, large_answer.text
        assert attacker.count(b"200") == 1 and attacker.count(b"429") == 5, attacker
        assert attention_answer.status_code == 200, attention_answer.text[:300]


@pytest.mark.parametrize("share", ["0.25", "1"])
def test_one_client_address_cannot_fill_the_queue_for_the_others(tiny_sentinel_checkpoint, share):
    """One address sending many requests at once keeps at most its share (NMT_CLIENT_SHARE_IN_FLIGHT)
    of the queue's texts (NMT_MAX_QUEUE_ITEMS) waiting for or in a worker; past it 429 for that
    address, while another address's request is queued and answered. With the share the whole
    queue ("1"), the same requests fill the queue and the other address gets 429 "too busy". The
    one worker is held by a slow text (NMT_FAULT_INJECTION) meanwhile, so nothing drains."""
    import asyncio

    from app.pipe import FAULT_SLOW

    def client(address: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address), timeout=60)

    def texts(n: int, tag: int) -> dict:  # n texts of one sentence each: n queue items
        return {"q": [f"Open file {tag} number {i}." for i in range(n)], "source": "en", "target": "de"}

    async def main(url: str):
        async with client("127.0.0.3") as slow, client("127.0.0.1") as attacker, client("127.0.0.2") as other:
            stall = asyncio.create_task(slow.post(f"{url}/translate", json={"q": FAULT_SLOW, "source": "en",
                                                                           "target": "de"}))
            await asyncio.sleep(0.5)  # the worker is held
            flood = [asyncio.create_task(attacker.post(f"{url}/translate", json=texts(16, k))) for k in range(8)]
            await asyncio.sleep(0.5)  # all eight are in: queued, or refused
            refused_at_once = [task.result() for task in flood if task.done()]
            answer = await other.post(f"{url}/translate", json=texts(4, 99))
            answers = await asyncio.gather(*flood)
            await stall
            return refused_at_once, answers, answer

    with running_server({"NMT_MODEL_DIRS": str(tiny_sentinel_checkpoint), "NMT_WORKERS": "1",
                         "NMT_THREADS_PER_WORKER": "1", "NMT_DETECT_LANGUAGES": "none", "NMT_CACHE": "false",
                         "NMT_FAULT_INJECTION": "true", "NMT_MAX_QUEUE_ITEMS": "64",
                         "NMT_CLIENT_SHARE_IN_FLIGHT": share}) as (url, process):
        refused_at_once, answers, answer = asyncio.run(main(url))
    statuses = sorted(a.status_code for a in answers)
    print(f"\nshare {share}: the attacker's 8 requests of 16 texts {statuses}; another address's {answer.status_code}")
    if share == "1":  # 64 texts: four requests fill the queue
        assert statuses == [200] * 4 + [429] * 4, statuses
        assert answer.status_code == 429 and "too busy" in answer.json()["error"], answer.text
    else:  # 16 texts: one request
        assert statuses == [200] + [429] * 7, statuses
        assert all("for this client (127.0.0.1)" in a.json()["error"] for a in refused_at_once), refused_at_once
        assert len(refused_at_once) == 7
        assert answer.status_code == 200, answer.text
