"""Every endpoint and error through the ASGI app (TestClient runs its lifespan), with two tiny
models served at once (en-de and de-en) and one worker process; language detection (/detect,
source 'auto') on a second app whose model directories have language profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app.language import LanguageDetector
from app.settings import Settings
from model.translator import Translator, auto_dtype
from tests.conftest import make_tiny_checkpoint, ready_client

MAX_ITEMS, MAX_CHARS = 4, 400


@pytest.fixture(scope="module")
def de_en(tmp_path_factory) -> Path:
    directory = make_tiny_checkpoint(tmp_path_factory.mktemp("de-en"), seed=1)
    (directory / "metadata.json").write_text(json.dumps({"source_lang": "de", "target_lang": "en",
                                                         "decoding": {"length_penalty": 2.5}}))
    return directory


@pytest.fixture(scope="module")
def client(tiny_checkpoint, de_en):
    settings = Settings(model_dirs=[str(tiny_checkpoint), str(de_en)], workers=1, threads_per_worker=1,
                        max_items=MAX_ITEMS, max_chars=MAX_CHARS, max_wait_ms=2)
    with ready_client(settings) as c:
        yield c


@pytest.fixture(scope="module")
def offline(tiny_checkpoint):
    return Translator.load(tiny_checkpoint, device="cpu", dtype="auto")  # what the service runs by default


def translate(client, status=200, **body):
    body = {"source": "en", "target": "de", **body}
    r = client.post("/v1/translate", json=body)
    assert r.status_code == status, r.text
    return r.json()


def error(client, method, path, status=400, **kwargs) -> str:
    r = client.request(method, path, **kwargs)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"}
    return r.json()["error"]


# --- health ----------------------------------------------------------------------------------

def test_health_ready_metrics(client):
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready").json()
    assert ready["ready"] and ready["models"] == ["de-en", "en-de"]
    assert ready["workers"][0]["state"] in ("idle", "busy") and ready["workers"][0]["device"] == "cpu"
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "nmt_queue_depth" in r.text and "nmt_workers_alive 1.0" in r.text


def test_what_the_server_loaded_is_frozen_out_of_the_collectors_walks_while_it_runs(tiny_checkpoint):
    import gc

    gc.unfreeze()
    with ready_client(Settings(model_dirs=[str(tiny_checkpoint)], workers=1, threads_per_worker=1)) as c:
        assert gc.get_freeze_count() > 10_000  # modules, the app, the models' tokenizers
        assert translate(c, text="hello")["translations"]
    assert gc.get_freeze_count() == 0  # stopped: collectable again


# --- /v1/translate ---------------------------------------------------------------------------

def test_translate_one_text_matches_offline_translator(client, offline):
    body = translate(client, text="Hello world.", beam_size=3, length_penalty=0.6)
    [expected] = offline.translate(["Hello world."], beam_size=3, length_penalty=0.6)
    assert body["model"] == "en-de"
    [t] = body["translations"]
    assert set(t) == {"text", "score", "alternatives"}  # nothing that was not asked for
    assert t["text"] == expected.hypotheses[0].text and t["alternatives"] == []
    assert t["score"] == pytest.approx(expected.hypotheses[0].score, abs=1e-4)
    timing = body["timing"]
    assert set(timing) == {"queue_ms", "compute_ms", "total_ms"}
    assert timing["queue_ms"] >= 0 and 0 < timing["compute_ms"] <= timing["total_ms"]


def test_translate_list_with_alternatives_alignments_and_attention(client, offline):
    texts = ["Open the file.", "Click the button to print the document.", "Hello world."]
    body = translate(client, text=texts, beam_size=4, n_best=3, alignments=True, include_attention=True,
                     max_length=12)
    expected = offline.translate(texts, beam_size=4, n_best=3, max_length=12, attention=True)
    assert len(body["translations"]) == 3
    for t, e in zip(body["translations"], expected):
        assert [t["text"]] + [a["text"] for a in t["alternatives"]] == [h.text for h in e.hypotheses]
        assert len(t["alternatives"]) == 2 and all(a["alignment_id"] for a in t["alternatives"])
        assert t["alignment_id"] and t["source_tokens"] == e.source_tokens
        assert t["target_tokens"] == e.hypotheses[0].target_tokens
        attention = torch.tensor(t["attention"])
        assert attention.shape == (2, 4, len(t["target_tokens"]), len(t["source_tokens"]))
        torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:3]), atol=2e-3, rtol=0)


def test_a_repetition_penalty_decodes_as_the_library_does(client, offline):
    texts = ["Hello world, this is a small test sentence.", "Open the file and the file."]
    for penalty in (1.0, 3.0):
        body = translate(client, text=texts, beam_size=3, n_best=2, repetition_penalty=penalty)
        expected = offline.translate(texts, beam_size=3, n_best=2, repetition_penalty=penalty)
        for out, result in zip(body["translations"], expected, strict=True):
            assert [out["text"]] + [a["text"] for a in out["alternatives"]] == [h.text for h in result.hypotheses]
    texts_of = lambda body: [[t["text"]] + [a["text"] for a in t["alternatives"]] for t in body["translations"]]  # noqa: E731
    assert texts_of(body) != texts_of(translate(client, text=texts, beam_size=3, n_best=2))  # it did something


def test_a_models_own_length_penalty_is_the_default(client):
    models = {m["id"]: m for m in client.get("/v1/models").json()["models"]}
    assert (models["de-en"]["length_penalty"], models["en-de"]["length_penalty"]) == (2.5, 1.0)
    scores = lambda body: [t["score"] for t in body["translations"]]  # noqa: E731
    texts = ["Hallo Welt, wie geht es dir heute?", "Die Datei wurde gespeichert."]
    asked = {"text": texts, "source": "de", "target": "en", "beam_size": 2}
    default, own = translate(client, **asked), translate(client, **asked, length_penalty=2.5)
    plain = translate(client, **asked, length_penalty=1.0)
    assert scores(default) == scores(own) != scores(plain)


def test_second_model_serves_its_own_pair(client, de_en):
    body = translate(client, text="Hallo Welt.", source="de", target="en")
    assert body["model"] == "de-en"
    [expected] = Translator.load(de_en, device="cpu", dtype="auto").translate(["Hallo Welt."])
    assert body["translations"][0]["text"] == expected.hypotheses[0].text


def test_the_service_and_the_library_finish_texts_with_one_pipeline(client, offline):
    """The server prepares the texts and finishes the worker's hypotheses with the pipeline the
    Translator runs (model/pipeline.py): placeholders taken out and placed back by the attention
    (this model has no sentinel pieces), in capitals too; an accelerator mark; a glossary term.
    Texts, alternatives and terms reports are the library's."""
    from model.terms import Terminology

    glossary = {"file": "Akte"}
    for texts in (["Open %s now.", "Save &As...", "OPEN %s NOW.", "Mail ada@example.com the file."],
                  ["OPEN THE FILE.", "Print the {name} file."]):
        body = translate(client, text=texts, beam_size=3, n_best=2, glossary=glossary)
        expected = offline.translate(texts, beam_size=3, n_best=2, terms=Terminology(glossary))
        for out, result in zip(body["translations"], expected, strict=True):
            assert [out["text"]] + [a["text"] for a in out["alternatives"]] == [h.text for h in result.hypotheses]
            assert out["terms"] == result.terms


# --- /v1/alignments --------------------------------------------------------------------------

def test_alignment_views(client):
    t = translate(client, text="The quick brown fox jumps.", alignments=True, include_attention=True,
                  max_length=8)["translations"][0]
    path = f"/v1/alignments/{t['alignment_id']}"
    full = client.get(path).json()
    assert full["model"] == "en-de" and (full["layers"], full["heads"]) == (2, 4)
    assert full["granularity"] == "subword" and full["layer"] is None and full["head"] is None
    assert full["source_tokens"] == t["source_tokens"]
    # stored as float16 (3 significant digits), returned inline as computed
    torch.testing.assert_close(torch.tensor(full["attention"]), torch.tensor(t["attention"]), atol=1e-3, rtol=0)
    assert full["hard_alignment"] is None

    one = client.get(path, params={"layer": 1, "head": "mean"}).json()
    attention = torch.tensor(one["attention"])
    assert attention.shape == (1, 1, len(full["target_tokens"]), len(full["source_tokens"]))
    expected = torch.tensor(full["attention"])[1:2].mean(1, keepdim=True)
    torch.testing.assert_close(attention, expected, atol=2e-6, rtol=0)
    assert one["layer"] == 1 and one["head"] == "mean"

    words = client.get(path, params={"granularity": "word", "hard": "true", "layer": "mean"}).json()
    assert words["source_tokens"][-1] == "</s>" and words["source_tokens"][0] == "The"
    attention = torch.tensor(words["attention"])
    assert attention.shape[:2] == (1, 4)
    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:3]), atol=2e-3, rtol=0)
    pairs = [tuple(map(int, p.split("-"))) for p in words["hard_alignment"].split()]
    eos_rows = words["target_tokens"][-1:] == ["</s>"]
    assert len(pairs) == len(words["target_tokens"]) - eos_rows
    assert all(0 <= s < len(words["source_tokens"]) - 1 for s, _ in pairs)


def test_alignment_errors(client):
    t = translate(client, text="Hello.", alignments=True, max_length=4)["translations"][0]
    path = f"/v1/alignments/{t['alignment_id']}"
    assert "0 to 1" in error(client, "GET", path, params={"layer": 2})
    assert "0 to 3" in error(client, "GET", path, params={"head": -1})
    assert "head" in error(client, "GET", path, params={"head": "max"})
    assert "granularity" in error(client, "GET", path, params={"granularity": "char"})
    assert "unknown or expired" in error(client, "GET", "/v1/alignments/nope", status=404)


def test_a_query_parameter_given_twice_is_refused_or_read_as_a_list_never_cut_to_its_last_value(client, offline):
    t = translate(client, text="Hello.", alignments=True, max_length=4)["translations"][0]
    path = f"/v1/alignments/{t['alignment_id']}"
    assert client.get(f"{path}?layer=0&head=1").status_code == 200
    message = error(client, "GET", f"{path}?layer=0&head=1&layer=1")
    assert "'layer' 2 times" in message and "head" not in message
    r = client.get("/v2/languages?type=source&type=target&type=target")  # DeepL's errors: {"message": ...}
    assert r.status_code == 400 and "'type' 3 times" in r.json()["message"]
    # under a JSON body, as in a form, a repeated field is a list: LibreTranslate's q texts, or a 400
    [one, two] = offline.translate(["Hello world.", "Open the file."], beam_size=4)
    r = client.post("/translate?q=Hello+world.&q=Open+the+file.", json={"source": "en", "target": "de"})
    assert r.json() == {"translatedText": [one.hypotheses[0].text, two.hypotheses[0].text]}
    assert "target" in error(client, "POST", "/translate?target=de&target=fr", json={"q": "Hi", "source": "en"})


# --- /v1/models, /v1/languages ---------------------------------------------------------------

def test_models_and_languages(client):
    models = {m["id"]: m for m in client.get("/v1/models").json()["models"]}
    assert set(models) == {"en-de", "de-en"}
    m = models["en-de"]
    assert (m["source"], m["target"], m["device"], m["dtype"]) == ("en", "de", "cpu", auto_dtype("cpu"))
    assert m["config"]["d_model"] == 64 and m["max_source_tokens"] == 128 and m["parameters"] > 10_000
    assert m["cpu_kernels"] is True  # built here (tests/test_kernels.py says why they must)
    from model import kernels

    int8 = auto_dtype("cpu") == "int8"
    assert m["fused"] is int8 and m["int8_path"] == (kernels.int8_path() if int8 else None)
    v1 = client.get("/v1/languages").json()
    assert {(p["source"], p["target"], p["model"]) for p in v1["pairs"]} == {("en", "de", "en-de"),
                                                                              ("de", "en", "de-en")}
    assert client.get("/languages").json() == [{"code": "de", "name": "German", "targets": ["en"]},
                                               {"code": "en", "name": "English", "targets": ["de"]}]


# --- bad input -------------------------------------------------------------------------------

def test_bad_texts(client):
    post = lambda **body: error(client, "POST", "/v1/translate", json={"source": "en", "target": "de", **body})  # noqa: E731
    assert post(text="") == "text is empty"
    assert post(text=["ok", "  "]) == "text[1] is empty"
    assert post(text=[]) == "text: give at least one text"
    assert f"at most {MAX_ITEMS}" in post(text=["a"] * (MAX_ITEMS + 1))
    assert f"at most {MAX_CHARS}" in post(text="a" * (MAX_CHARS + 1))
    message = post(text="Hello world " * 30)  # under the character limit, over 128 tokens
    assert "tokens" in message and "at most 128" in message


def test_bad_options(client):
    post = lambda **body: error(client, "POST", "/v1/translate", json={"text": "Hi", "source": "en", "target": "de", **body})  # noqa: E731
    assert "beam_size" in post(beam_size=0) and "16" in post(beam_size=17)
    assert post(beam_size=2, n_best=3) == "n_best (3) must be at most beam_size (2)"
    assert "length_penalty" in post(length_penalty=-1)
    assert "max_length" in post(max_length=0)
    assert "repetition_penalty" in post(repetition_penalty=0.5) and "repetition_penalty" in post(repetition_penalty=11)
    message = post(target="fr")
    assert "'en' to 'fr'" in message and "de-en, en-de" in message
    # 'auto' on a text too short to tell: the likeliest served source language, not a refusal
    assert translate(client, text="Hi", source="auto")["model"] == "en-de"
    assert "text" in post(text=5) and "valid string" in post(text=5)
    assert "alignments" in post(alignments="maybe")
    assert "unknown field; allowed:" in post(beam=3) and "beam_size" in post(beam=3)
    assert error(client, "POST", "/v1/translate", json={"text": "Hi", "target": "de"}) == "source: required"
    assert "malformed JSON" in error(client, "POST", "/v1/translate", content=b'{"text": ',
                                     headers={"content-type": "application/json"})


def test_unknown_route_and_method_use_the_error_shape(client):
    assert "/v9/x" in error(client, "GET", "/v9/x", status=404)
    error(client, "GET", "/v1/translate", status=405)
    deepl = client.get("/v2/x")  # DeepL's API answers in DeepL's shape (app/routers/deepl.py)
    assert deepl.status_code == 404 and "/v2/x" in deepl.json()["message"] and "error" not in deepl.json()


def test_api_keys(client, monkeypatch):
    monkeypatch.setattr(client.app.state.service.settings, "api_keys", ["secret"])
    body = {"text": "Hi", "source": "en", "target": "de"}
    assert "API key" in error(client, "POST", "/v1/translate", status=403, json=body)
    assert error(client, "POST", "/v1/translate", status=403, json={**body, "api_key": "wrong"}) == "Invalid API key"
    assert client.post("/v1/translate", json=body, headers={"X-API-Key": "secret"}).status_code == 200
    lt = {"q": "Hi", "source": "en", "target": "de"}
    assert error(client, "POST", "/translate", status=403, data=lt) == "an API key is required: pass api_key in " \
        "the body or an X-API-Key header"
    assert client.post("/translate", json={**lt, "api_key": "secret"}).status_code == 200
    assert client.post("/translate", data={**lt, "api_key": "secret"}).status_code == 200


def test_queue_full_is_429(client, monkeypatch):
    monkeypatch.setattr(client.app.state.service.engine.scheduler, "max_queue_items", 0)
    assert "too busy" in error(client, "POST", "/v1/translate", status=429,
                               json={"text": "A text never translated before.", "source": "en", "target": "de"})


# --- LibreTranslate --------------------------------------------------------------------------

def test_libretranslate_json_and_form(client, offline):
    [one, two] = offline.translate(["Hello world.", "Open the file."], beam_size=4, n_best=3)
    r = client.post("/translate", json={"q": "Hello world.", "source": "en", "target": "de"})
    assert r.json() == {"translatedText": one.hypotheses[0].text}
    r = client.post("/translate", json={"q": ["Hello world.", "Open the file."], "source": "en", "target": "de",
                                        "format": "text", "alternatives": 2})
    assert r.json() == {"translatedText": [one.hypotheses[0].text, two.hypotheses[0].text],
                        "alternatives": [[h.text for h in one.hypotheses[1:]], [h.text for h in two.hypotheses[1:]]]}
    # libretranslatepy and Weblate send form data
    r = client.post("/translate", data={"q": "Hello world.", "source": "en", "target": "de", "alternatives": "2"})
    assert r.json() == {"translatedText": one.hypotheses[0].text, "alternatives": [h.text for h in one.hypotheses[1:]]}


def test_libretranslate_errors(client):
    assert "format" in error(client, "POST", "/translate", json={"q": "Hi", "source": "en", "target": "de",
                                                                 "format": "markdown"})
    assert error(client, "POST", "/translate", data={"source": "en", "target": "de"}) == "q: required"
    assert "no model translates into 'fr'" in error(client, "POST", "/translate",
                                                    json={"q": "Hi", "source": "auto", "target": "fr"})
    assert "'en' to 'xx'" in error(client, "POST", "/translate", json={"q": "Hi", "source": "en", "target": "xx"})
    assert error(client, "POST", "/translate", json={"q": "", "source": "en", "target": "de"}) == "q is empty"
    assert "alternatives" in error(client, "POST", "/translate", data={"q": "Hi", "source": "en", "target": "de",
                                                                       "alternatives": "many"})
    assert "malformed JSON" in error(client, "POST", "/translate", content=b"{",
                                     headers={"content-type": "application/json"})
    assert "JSON body must be an object" in error(client, "POST", "/translate", json=["Hi"])
    huge = b'{"q": "Hi", "source": "en", "target": "de", "alternatives": ' + b"9" * 5000 + b"}"
    for path in ("/translate", "/v1/translate"):  # in the client's terms, not the interpreter's setting
        assert error(client, "POST", path, content=huge, headers={"content-type": "application/json"}) == \
            "malformed JSON: a number has more than 4,300 digits"


def test_metrics_count_routes_batches_and_tokens(client):
    translate(client, text=["Hello.", "World."])
    text = client.get("/metrics").text
    assert 'nmt_requests_total{method="POST",route="/v1/translate",status="200"}' in text
    assert 'nmt_requests_total{method="POST",route="/v1/translate",status="400"}' in text
    for name in ("nmt_queue_wait_seconds_bucket", "nmt_compute_seconds_bucket", "nmt_batch_size_bucket",
                 "nmt_batch_tokens_bucket", "nmt_generated_tokens_total", "nmt_worker_busy_seconds_total"):
        assert name in text


# --- the OpenAPI document --------------------------------------------------------------------

def test_openapi_fields_are_described_with_examples_and_errors_are_400(client):
    spec = client.get("/openapi.json").json()
    for name, schema in spec["components"]["schemas"].items():
        for field, prop in schema.get("properties", {}).items():
            assert prop.get("description"), f"{name}.{field} has no description"
            assert "examples" in prop or "example" in prop or "$ref" in str(prop) or prop.get("type") == "array", \
                f"{name}.{field} has no example"
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], f"{method} {path}"
            for parameter in operation.get("parameters", []):
                assert parameter.get("description"), f"{method} {path} {parameter['name']}"


# --- language detection: POST /detect and source 'auto' --------------------------------------

GERMAN_TEXT = "Mein Bruder hat ein neues Auto gekauft, weil das alte kaputt war."
ENGLISH_TEXT = "My brother bought a new car because the old one was broken."
SHORT_GERMAN = "Das Auto ist kaputt."  # short: detected with less than 100% confidence


FRENCH_TEXT = "Mon frère a acheté une nouvelle voiture parce que l'ancienne était cassée."


@pytest.fixture(scope="module")
def fr_de(tmp_path_factory) -> Path:
    directory = make_tiny_checkpoint(tmp_path_factory.mktemp("fr-de"), seed=2)
    (directory / "metadata.json").write_text(json.dumps({"source_lang": "fr", "target_lang": "de"}))
    return directory


@pytest.fixture(scope="module")
def detecting(tiny_checkpoint, de_en, fr_de):
    """en-de, de-en and fr-de, detecting among four languages (lingua's models for them load fast)."""
    settings = Settings(model_dirs=[str(tiny_checkpoint), str(de_en), str(fr_de)], workers=1, threads_per_worker=1,
                        max_items=MAX_ITEMS, max_chars=MAX_CHARS, max_wait_ms=2, detect_languages=["en", "de", "fr", "it"])
    with ready_client(settings) as c:
        yield c


def test_detect_tells_the_language_even_when_it_is_not_served(detecting):
    r = detecting.post("/detect", json={"q": GERMAN_TEXT})
    assert r.status_code == 200, r.text
    found = r.json()
    assert found[0]["language"] == "de" and found[0]["confidence"] > 90
    assert sum(d["confidence"] for d in found) <= 100.1
    assert detecting.post("/detect", data={"q": ENGLISH_TEXT}).json()[0]["language"] == "en"  # form data
    lists = detecting.post("/detect", json={"q": [ENGLISH_TEXT, GERMAN_TEXT, "42 + 1"]}).json()
    assert [found[0]["language"] if found else None for found in lists] == ["en", "de", None]
    repeated = detecting.post("/detect", data={"q": [GERMAN_TEXT, ENGLISH_TEXT]}).json()  # q repeated in a form
    assert [found[0]["language"] for found in repeated] == ["de", "en"]
    italian = detecting.post("/detect", json={"q": "Mio fratello ha comprato una macchina nuova."}).json()
    assert italian[0]["language"] == "it"  # not served at all


def test_detect_errors(detecting, tiny_checkpoint, monkeypatch):
    post = lambda status=400, **kwargs: error(detecting, "POST", "/detect", status=status, **kwargs)  # noqa: E731
    assert post(json={}) == "q: required" and post(data={}) == "q: required"
    assert post(json={"q": ""}) == "q is empty"
    assert post(json={"q": []}) == "q: give at least one text"
    assert f"at most {MAX_CHARS}" in post(json={"q": ["ok", "a" * (MAX_CHARS + 1)]})
    assert "JSON body must be an object with q" in post(json=["Hi"])
    monkeypatch.setattr(detecting.app.state.service.settings, "api_keys", ["secret"])
    assert "API key" in post(status=403, json={"q": GERMAN_TEXT})
    assert detecting.post("/detect", data={"q": GERMAN_TEXT, "api_key": "secret"}).status_code == 200
    with ready_client(Settings(model_dirs=[str(tiny_checkpoint)], workers=1, threads_per_worker=1,
                               detect_languages="none")) as off:
        assert "detection is off" in error(off, "POST", "/detect", json={"q": GERMAN_TEXT})
    with pytest.raises(ValueError, match="xx unknown to the detector"):
        LanguageDetector(["en", "xx"])
    preloaded = LanguageDetector(["en", "de", "fr"], preload=True)
    assert preloaded.preloaded and preloaded.detect("Bonjour à tous, comment allez-vous ?")[0][0] == "fr"


def test_auto_source_detects_each_text(detecting, de_en, fr_de, tiny_checkpoint):
    translate_one = lambda directory, text: Translator.load(directory, device="cpu", dtype="auto").translate(  # noqa: E731
        [text], beam_size=4)[0].hypotheses[0].text
    r = detecting.post("/translate", json={"q": SHORT_GERMAN, "source": "auto", "target": "en"})
    assert r.status_code == 200, r.text
    assert r.json()["translatedText"] == translate_one(de_en, SHORT_GERMAN)
    assert r.json()["detectedLanguage"]["language"] == "de"
    # a list in two languages: each text from its own (LibreTranslate used the first text's for all)
    r = detecting.post("/translate", json={"q": [ENGLISH_TEXT, FRENCH_TEXT], "source": "auto", "target": "de"})
    assert r.status_code == 200, r.text
    assert [d["language"] for d in r.json()["detectedLanguage"]] == ["en", "fr"]
    assert r.json()["translatedText"] == [translate_one(tiny_checkpoint, ENGLISH_TEXT), translate_one(fr_de, FRENCH_TEXT)]
    body = translate(detecting, text=[GERMAN_TEXT], source="auto", target="en")
    assert body["model"] == "de-en"
    message = error(detecting, "POST", "/v1/translate", json={"text": [ENGLISH_TEXT, FRENCH_TEXT], "source": "auto",
                                                              "target": "de"})
    assert "text[0] looks English and text[1] French" in message
    message = error(detecting, "POST", "/translate", json={"q": "Mio fratello ha comprato una macchina nuova.",
                                                           "source": "auto", "target": "de"})
    assert "looks Italian (it, " in message
    message = error(detecting, "POST", "/v1/translate", json={"text": "1234", "source": "auto", "target": "de"})
    assert "no language detected" in message and "en, fr" in message


def translated_items(client) -> float:
    lines = [x for x in client.get("/metrics").text.splitlines() if x.startswith("nmt_translated_items_total")]
    return sum(float(line.split()[-1]) for line in lines)


def test_a_text_already_in_the_target_language_is_kept_as_it_is(detecting):
    """As LibreTranslate (Argos's identity translation) and DeepL answer: no model runs. (en -> en
    used to go through a pivot, en -> de -> en, and a German text asked for in German with
    'auto' went to the en-de model when the detector was less than sure.)"""
    before = translated_items(detecting)
    lt = lambda **body: detecting.post("/translate", json=body).json()  # noqa: E731
    assert lt(q=ENGLISH_TEXT, source="en", target="en", alternatives=2) == {"translatedText": ENGLISH_TEXT,
                                                                             "alternatives": []}
    page = "<p>My <b>brother</b> &amp; me</p>"
    assert lt(q=page, source="en", target="en", format="html")["translatedText"] == page
    r = detecting.post("/v2/translate", data={"text": ENGLISH_TEXT, "source_lang": "EN", "target_lang": "EN-GB"})
    assert r.json()["translations"][0] == {"detected_source_language": "EN", "text": ENGLISH_TEXT,
                                           "billed_characters": len(ENGLISH_TEXT)}
    r = detecting.post("/translate_file", files={"file": ("notes.txt", ENGLISH_TEXT.encode())},
                       data={"source": "en", "target": "en"})
    assert detecting.get(r.json()["translatedFileUrl"]).content == ENGLISH_TEXT.encode()
    assert translated_items(detecting) == before
    # 'auto': the texts that look like the target language kept, the others translated
    body = lt(q=[ENGLISH_TEXT, GERMAN_TEXT], source="auto", target="de", alternatives=1, do_not_translate=["Bruder"],
              glossary={"Auto": "Wagen"})
    assert body["translatedText"][1] == GERMAN_TEXT and body["translatedText"][0] != ENGLISH_TEXT
    assert [d["language"] for d in body["detectedLanguage"]] == ["en", "de"]
    assert body["alternatives"][1] == [] and len(body["alternatives"][0]) == 1
    assert body["terms"][1] == {"applied": ["Bruder"], "not_applied": ["Auto"], "not_found": []}
    assert translated_items(detecting) == before + 1
    r = detecting.post("/v2/translate", json={"text": [SHORT_GERMAN], "target_lang": "DE"})
    assert r.json()["translations"][0]["text"] == SHORT_GERMAN
    assert r.json()["translations"][0]["detected_source_language"] == "DE"
    r = detecting.post("/translate_file", files={"file": ("notiz.txt", GERMAN_TEXT.encode())},
                       data={"source": "auto", "target": "de"})
    assert detecting.get(r.json()["translatedFileUrl"]).content == GERMAN_TEXT.encode()
    # the native API answers with a model's translation, so it says there is none to give
    message = error(detecting, "POST", "/v1/translate", json={"text": [ENGLISH_TEXT], "source": "en", "target": "en"})
    assert message == "source and target are both 'en': nothing to translate"
    message = error(detecting, "POST", "/v1/translate", json={"text": [ENGLISH_TEXT, GERMAN_TEXT], "source": "auto",
                                                              "target": "de"})
    assert message.startswith("source 'auto': text[1] looks German, the target language: nothing to translate")
    assert translated_items(detecting) == before + 1
    # a language no model serves is still not served
    assert "no model translates 'xx' to 'xx'" in error(detecting, "POST", "/translate",
                                                       json={"q": "Hi", "source": "xx", "target": "xx"})
