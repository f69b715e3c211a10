"""Requests as an attacker sends them, through the app: each of them was a 500, a file read or a
limit bypass (issue 44), and now gets a clear 4xx, or a 200 where the input is fine. Timing of
the inputs that cost seconds of CPU: bench-free regression checks below on the functions, and on
a real server in test_hostile_server.py."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from app.body_limit import json_shape_problem
from app.markup import split_document, split_html
from app.pipe import FAULT_SLOW
from app.settings import Settings
from model.protect import find_spans, take_out
from model.sentences import split_sentences
from model.terms import Terminology
from tests.conftest import ready_client


@pytest.fixture(scope="module")
def client(tiny_sentinel_checkpoint):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        cache=False, detect_languages=["en", "de"])  # lingua's models for two load in a moment
    with ready_client(settings) as c:
        yield c


def seconds(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


# --- client input at the limits costs time linear in its size -----------------------------------
# Each input cost seconds to hours before (quadratic or cubic); each must now take well under a
# second at the size the server admits. Generous bounds: these fail on the old code by 10-1000x.
MiB = 2**20
LINEAR_INPUTS = [
    ("JSON: escaped quotes, then brackets (4 MiB)",
     lambda: json_shape_problem(b'\\"' * (2 * MiB) + b"[" * 40, 32, 10_000)),
    ("sentences: a run of dots, then words (5,000 chars)", lambda: split_sentences("a" + "." * 2500 + " b" * 1249)),
    ("sentences: the same at a file's 200,000 chars", lambda: split_sentences("a" + "." * 100_000 + " b" * 49_999)),
    ("spans: one 200,000-letter word (the e-mail pattern)", lambda: find_spans("a" * 200_000)),
    ("spans: printf flags, '%' + '0' * 200,000", lambda: find_spans("%" + "0" * 200_000)),
    ("spans taken out: 50,000 placeholders", lambda: take_out("%s " * 50_000)),
    ("HTML: '<a ' * 60,000, unclosed", lambda: split_html("<a " * 60_000)),
    ("HTML with spans: '<a ' * 8,000", lambda: split_document("<a " * 8000, True, True)),
    ("glossary: 5,000 entries of a 1,000-unit term against 2,500 words",
     lambda: Terminology({"a " * 499 + f"b{i}": "x" for i in range(5)}).find("a " * 2500)),
]


@pytest.mark.parametrize("name,work", LINEAR_INPUTS, ids=[n for n, _ in LINEAR_INPUTS])
def test_client_input_costs_linear_time(name, work):
    assert seconds(work) < 1.0, name


def test_glossary_matching_is_whole_word_and_longest_first():
    terms = Terminology({"file": "Datei", "file manager": "Dateimanager", "Wi-Fi": "WLAN"}, ["C++", ".NET"])
    found = terms.find("Open the File Manager, a file, wi-fi, profile, C++ and a.NET, .NET.")
    assert [(m.output, m.entry) for m in found] == [("Dateimanager", "file manager"), ("Datei", "file"),
                                                     ("WLAN", "Wi-Fi"), ("C++", "C++"), (".NET", ".NET")]


# --- no 500 for any input ---------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {"q": "Press İ to continue.", "source": "en", "target": "de", "do_not_translate": ["i"]},
    {"q": "I am here.", "source": "en", "target": "de", "glossary": {"ı": "x"}},
    {"q": "Press İ to continue.", "source": "en", "target": "de", "glossary": {"İ": "x"}},
])
def test_dotted_and_dotless_i_in_terms_translate(client, body):
    assert client.post("/translate", json=body).status_code == 200


@pytest.mark.parametrize("where", ["glossary source", "glossary target", "do_not_translate"])
def test_a_lone_surrogate_in_a_term_is_a_400_that_says_so(client, where):
    term = "ab\ud800c"
    body = {"q": "Hello.", "source": "en", "target": "de"}
    if where == "do_not_translate":
        body["do_not_translate"] = [term]
    else:
        body["glossary"] = {term: "x"} if where == "glossary source" else {"x": term}
    import json
    data = json.dumps(body).encode()  # \\ud800 escaped: valid JSON, not valid Unicode
    response = client.post("/translate", content=data, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert "surrogate" in response.json()["error"]


def test_a_lone_surrogate_in_a_stored_glossary_name_is_a_400(client):
    import json
    data = json.dumps({"name": "n\udc00", "source_lang": "en", "target_lang": "de", "entries": "a\tb",
                       "entries_format": "tsv"}).encode()
    response = client.post("/v2/glossaries", content=data, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text


@pytest.mark.parametrize("path", ["/translate", "/v1/translate", "/v2/translate"])
def test_a_glossary_id_that_no_glossary_can_have_is_a_400_not_a_lookup(client, path):
    """A lone surrogate (valid JSON, not valid Unicode) reached SQLite, which cannot encode it: a 500,
    and the connection closed under the next request."""
    import json
    body = {"q": "Hello.", "source": "en", "target": "de", "text": ["Hello."], "source_lang": "EN",
            "target_lang": "DE", "glossary_id": "\ud800"}
    body = {k: v for k, v in body.items() if k in {"/translate": ("q", "source", "target", "glossary_id"),
                                                   "/v1/translate": ("text", "source", "target", "glossary_id"),
                                                   "/v2/translate": ("text", "source_lang", "target_lang",
                                                                     "glossary_id")}[path]}
    response = client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert "glossary" in response.text and "\\ud800" in response.text


def test_deepl_glossary_id_that_is_not_a_string_is_a_400(client):
    response = client.post("/v2/translate", json={"text": ["Hello."], "source_lang": "EN", "target_lang": "DE",
                                                   "glossary_id": ["x"]})
    assert response.status_code == 400, response.text
    assert "glossary_id" in response.text


# --- the .po reader never takes content for a path ----------------------------------------------

@pytest.mark.parametrize("content", [b"/etc/passwd", b"/etc/hostname", b"/proc/self/environ"])
def test_po_content_that_is_a_path_is_read_as_a_catalog(client, content):
    response = client.post("/translate_file", files={"file": ("x.po", content)}, data={"source": "en", "target": "de"})
    assert response.status_code == 400, response.text
    assert "/etc" not in response.text and "/proc" not in response.text and "/tmp" not in response.text


# --- secrets --------------------------------------------------------------------------------------

def test_an_unreachable_redis_is_named_to_clients_without_its_address_and_to_the_log_without_its_password():
    import asyncio

    from app.storage import RedisStorage, StorageUnavailable

    storage = RedisStorage("redis://:s3cret-pass@127.0.0.1:1/0")
    with pytest.raises(StorageUnavailable) as caught:
        asyncio.run(storage.check())
    assert str(caught.value) == "the shared store is unavailable"
    assert "s3cret-pass" not in caught.value.detail and "127.0.0.1:1" in caught.value.detail


def test_ready_and_503_bodies_hold_no_store_credentials(tiny_sentinel_checkpoint):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1,
                        redis_url="redis://user:s3cret-pass@127.0.0.1:1/0")
    with ready_client(settings) as c:
        ready = c.get("/ready")
        assert ready.json()["storage"] == "the shared store is unavailable" and "s3cret" not in ready.text
        gone = c.get("/v1/alignments/0123456789abcdef0123456789abcdef")
        assert gone.status_code == 503 and "s3cret" not in gone.text and "127.0.0.1" not in gone.text


# --- limits that hold ---------------------------------------------------------------------------

@pytest.fixture
def limited(tiny_sentinel_checkpoint, tmp_path):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        cache=False, req_limit=4, keys_db=str(tmp_path / "keys.db"), max_glossaries_per_key=2,
                        max_glossary_bytes_per_key=4096, max_attention_values=5_000)
    with ready_client(settings) as c:
        yield c


def test_stored_glossaries_are_capped_per_key(limited):
    def create(name: str, entries: str):
        return limited.post("/v2/glossaries", json={"name": name, "source_lang": "en", "target_lang": "de",
                                                    "entries": entries, "entries_format": "tsv"})

    assert create("big", "".join(f"term{i}\tBegriff{i}\n" for i in range(300))).status_code == 413
    assert [create(f"g{i}", "file\tDatei").status_code for i in range(3)] == [201, 201, 400]


def test_attention_per_request_is_capped(limited):
    body = {"text": ["Open the file and save it now."] * 3, "source": "en", "target": "de", "max_length": 20,
            "n_best": 4, "beam_size": 4, "alignments": True}
    response = limited.post("/v1/translate", json=body)
    assert response.status_code == 413 and "NMT_MAX_ATTENTION_VALUES" in response.json()["error"]


def test_attention_is_counted_before_decoding_at_the_most_target_tokens_a_text_may_get(tiny_sentinel_checkpoint):
    """The count a 413 names bounds what decoding could return, and nothing is decoded past it: at
    max_length m a request fits the limit and its attention within it, at m + 1 it is refused
    without a worker decoding anything."""
    limit = 5_000
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        cache=False, max_attention_values=limit)

    def translated(c) -> float:
        found = re.search(r'nmt_translated_items_total\{model="en-de"\} (\S+)', c.get("/metrics").text)
        return float(found.group(1)) if found else 0.0

    with ready_client(settings) as c:
        def ask(max_length: int, **more):
            return c.post("/v1/translate", json={"text": "Open the file and save it now.", "source": "en",
                                                 "target": "de", "beam_size": 2, "max_length": max_length,
                                                 "include_attention": True, **more})

        source_tokens = len(ask(1).json()["translations"][0]["source_tokens"])
        per_target_token = 2 * 4 * source_tokens  # the tiny model's decoder layers x heads x source tokens
        fits = limit // per_target_token
        answered = ask(fits)
        assert answered.status_code == 200, answered.text
        attention = np.array(answered.json()["translations"][0]["attention"])
        assert attention.shape[:2] == (2, 4) and attention.shape[3] == source_tokens and attention.size <= limit
        before = translated(c)
        refused = ask(fits + 1)
        assert refused.status_code == 413, refused.text
        assert f"{per_target_token * (fits + 1):,} values" in refused.json()["error"]
        assert "max_length" in refused.json()["error"]
        assert translated(c) == before  # refused before a worker saw it
        # stored as alignments and returned inline: two copies of each text's attention
        assert ask(fits // 2, alignments=True).status_code == 200
        assert ask(fits // 2 + 1, alignments=True).status_code == 413
        assert translated(c) == before + 1


def test_attention_in_flight_is_held_within_one_budget_until_each_response_is_sent(tiny_sentinel_checkpoint):
    """While one request that keeps attention is in flight (here held by a worker fault), another
    that would pass NMT_ATTENTION_IN_FLIGHT_VALUES together with it gets 429 (a request alone goes
    through, whatever its bound); requests without attention are not held back; once the first is
    answered, its reservation is gone."""
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        cache=False, fault_injection=True, request_timeout_s=20, max_attention_values=5_000,
                        attention_in_flight_values=1_000)  # under each request's bound: one at a time
    body = {"source": "en", "target": "de", "beam_size": 2, "max_length": 8, "include_attention": True}
    with ready_client(settings) as c:
        in_flight = c.app.state.service.attention_in_flight
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(c.post, "/v1/translate", json={**body, "text": f"Open the {FAULT_SLOW} file."})
            deadline = time.monotonic() + 10
            while not in_flight.values:  # until the slow one has reserved its attention
                assert time.monotonic() < deadline and not slow.done()
                time.sleep(0.01)
            held = in_flight.values
            refused = c.post("/v1/translate", json={**body, "text": "Save the file."})
            assert refused.status_code == 429, refused.text
            assert "NMT_ATTENTION_IN_FLIGHT_VALUES" in refused.json()["error"] and f"{held:,}" in refused.json()["error"]
            plain = {k: v for k, v in body.items() if k != "include_attention"}
            assert c.post("/v1/translate", json={**plain, "text": "Save the file."}).status_code == 200
            assert slow.result().status_code == 200
        assert in_flight.values == 0  # released once the response went out
        assert c.post("/v1/translate", json={**body, "text": "Save the file."}).status_code == 200
        assert in_flight.values == 0


def test_a_stored_alignments_answer_is_held_within_the_same_budget(client):
    """GET /v1/alignments/{id} reserves the values of the view it asks for until its answer has gone
    out, like the translation that stored it: 40 unread GETs of an 11.4 MiB alignment had grown
    `nmt serve` by 466 MiB (all answered); within the budget, 11 answered, 29 got 429, +135 MiB
    (/tmp script against the shipped en-de)."""
    r = client.post("/v1/translate", json={"text": ["Open the file and save it."], "source": "en", "target": "de",
                                           "alignments": True})
    alignment_id = r.json()["translations"][0]["alignment_id"]
    in_flight = client.app.state.service.attention_in_flight
    whole = client.get(f"/v1/alignments/{alignment_id}").json()
    values = whole["layers"] * whole["heads"] * len(whole["source_tokens"]) * len(whole["target_tokens"])
    assert in_flight.values == 0  # released once it went out
    scope = {}
    in_flight.reserve(scope, in_flight.budget - values + 1)  # another request holds all but values - 1
    try:
        refused = client.get(f"/v1/alignments/{alignment_id}")
        assert refused.status_code == 429 and f"could hold {values:,}" in refused.json()["error"], refused.text
        assert "layer=mean" in refused.json()["error"]
        reduced = client.get(f"/v1/alignments/{alignment_id}", params={"layer": "mean", "head": "mean"})
        assert reduced.status_code == 200, reduced.text  # a view of one layer and head holds less
    finally:
        in_flight.release(scope)
    assert in_flight.values == 0


def test_get_routes_count_against_the_rate_limit(limited):
    answers = [limited.get("/v1/alignments/0123456789abcdef0123456789abcdef").status_code for _ in range(6)]
    assert answers[:4] == [404] * 4 and answers[4:] == [429, 429]


def test_a_sentence_costs_one_against_the_limit(limited):
    text = " ".join(["Open the file."] * 5)  # one text, five sentences: five of the four a minute allowed
    response = limited.post("/translate", json={"q": text, "source": "en", "target": "de"})
    assert response.status_code == 429, response.text


def test_one_clients_stored_results_cannot_fill_the_store(tiny_sentinel_checkpoint):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        cache=False, api_keys=["k1", "k2"], client_alignment_bytes=6_000)
    body = {"text": "Open the file now.", "source": "en", "target": "de", "max_length": 8, "alignments": True}
    with ready_client(settings) as c:
        first = [c.post("/v1/translate", json=body, headers={"x-api-key": "k1"}).status_code for _ in range(8)]
        assert first[0] == 200 and first[-1] == 429 and "NMT_CLIENT_ALIGNMENT_BYTES" in c.post(
            "/v1/translate", json=body, headers={"x-api-key": "k1"}).text
        assert c.post("/v1/translate", json=body, headers={"x-api-key": "k2"}).status_code == 200  # its own share


def test_a_requests_texts_have_a_cpu_budget(tiny_sentinel_checkpoint):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        cache=False, text_cpu_budget_s=0.001)
    with ready_client(settings) as c:
        response = c.post("/translate", json={"q": ["<b>Open</b> the %s file. " * 200] * 8, "source": "en",
                                              "target": "de", "format": "html"})
    assert response.status_code == 413 and "NMT_TEXT_CPU_BUDGET_S" in response.json()["error"]


def test_a_keys_char_limit_holds_on_deepl_and_on_files(tiny_sentinel_checkpoint, tmp_path):
    from app.keys import KeyStore

    KeyStore(tmp_path / "keys.db").add(0, "twenty", char_limit=20)
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        cache=False, keys_db=str(tmp_path / "keys.db"))
    long_text = "Open the file and save it."  # 26 characters
    with ready_client(settings) as c:
        deepl = c.post("/v2/translate", json={"text": [long_text], "source_lang": "EN", "target_lang": "DE"},
                       headers={"Authorization": "DeepL-Auth-Key twenty"})
        assert deepl.status_code == 400 and "at most 20" in deepl.text
        file = c.post("/translate_file", files={"file": ("a.txt", long_text.encode())},
                      data={"source": "en", "target": "de", "api_key": "twenty"})
        assert file.status_code == 400 and "at most 20" in file.text
        assert c.post("/v2/translate", json={"text": ["Open it."], "source_lang": "EN", "target_lang": "DE"},
                      headers={"Authorization": "DeepL-Auth-Key twenty"}).status_code == 200


# Each field of each route given each of these, alone on an otherwise valid request: every answer
# is a 2xx or a 4xx (a JSON escape such as \ud800 is valid JSON but not valid Unicode).
ODD_VALUES = [None, True, 0, -1, 2**63, 1.5, 1e308, "", " ", "xml", "0", "nonewlines", "\ud800", "\x00",
              "x" * 3000, "<b>Hi</b>", "%s {x}", [], [None], [1, 2], ["\ud800"], {}, {"a": 1}, {"\ud800": "b"}]
ROUTE_FIELDS = {
    "/translate": ({"q": "Hello world.", "source": "en", "target": "de"},
                   ["q", "source", "target", "format", "alternatives", "api_key", "glossary", "glossary_id",
                    "do_not_translate"]),
    "/v1/translate": ({"text": ["Hello world."], "source": "en", "target": "de"},
                      ["text", "source", "target", "beam_size", "n_best", "max_length", "length_penalty",
                       "alignments", "include_attention", "glossary", "glossary_id", "do_not_translate"]),
    "/v2/translate": ({"text": ["Hello world."], "target_lang": "DE"},
                      ["text", "source_lang", "target_lang", "tag_handling", "split_sentences", "ignore_tags",
                       "formality", "glossary_id"]),
    "/detect": ({"q": "Hello world."}, ["q", "api_key"]),
    "/v2/glossaries": ({"name": "g", "source_lang": "EN", "target_lang": "DE", "entries": "a\tb",
                        "entries_format": "tsv"}, ["name", "source_lang", "target_lang", "entries", "entries_format"]),
}


@pytest.mark.parametrize("path", list(ROUTE_FIELDS))
def test_every_field_given_odd_values_gets_an_answer_that_is_not_a_server_error(client, path):
    import json
    base, fields = ROUTE_FIELDS[path]
    failures = []
    for field in fields:
        for value in ODD_VALUES:
            body = json.dumps({**base, field: value}).encode()
            r = client.post(path, content=body, headers={"content-type": "application/json"})
            if r.status_code >= 500:
                failures.append((field, value, r.status_code, r.text[:120]))
    assert not failures, failures
