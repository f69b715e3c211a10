"""Glossaries in every API: per request in /translate (JSON and form), /v1/translate and
/translate_file; stored ones through DeepL's /v2/glossaries, used by glossary_id there and in
/v2/translate; DeepL's error shape and limits; one key's glossaries hidden from another; and the
real `deepl` client against a real server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.settings import Settings
from tests.conftest import ready_client, running_server

ENTRIES = "file\tAkte\nNextcloud\tNextcloud\n"


@pytest.fixture(scope="module")
def client(tiny_sentinel_checkpoint, tmp_path_factory):
    db = tmp_path_factory.mktemp("keys") / "keys.db"
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        keys_db=str(db))
    with ready_client(settings) as c:
        yield c


def test_per_request_terms_in_libretranslate_json_and_form(client):
    body = {"q": "Open the file in Nextcloud.", "source": "en", "target": "de", "glossary": {"file": "Akte"},
            "do_not_translate": ["Nextcloud"]}
    r = client.post("/translate", json=body)
    assert r.status_code == 200, r.text
    assert "Akte" in r.json()["translatedText"] and "Nextcloud" in r.json()["translatedText"]
    assert r.json()["terms"] == {"applied": ["file", "Nextcloud"], "not_applied": [], "not_found": []}
    form = {**body, "glossary": json.dumps(body["glossary"]), "do_not_translate": "Nextcloud", "format": "html"}
    r = client.post("/translate", data=form)
    assert r.status_code == 200 and r.json()["terms"]["applied"] == ["file", "Nextcloud"], r.text
    listed = client.post("/translate", json={**body, "q": ["Open the file.", "Hello world."]}).json()
    assert [t["applied"] for t in listed["terms"]] == [["file"], []]
    plain = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "de"}).json()
    assert set(plain) == {"translatedText"}  # no terms asked, no change


def test_per_request_terms_in_v1_and_files(client):
    r = client.post("/v1/translate", json={"text": ["Open the file.", "Hello."], "source": "en", "target": "de",
                                           "glossary": {"file": "Akte"}})
    assert r.status_code == 200, r.text
    first, second = r.json()["translations"]
    assert "Akte" in first["text"] and first["terms"]["applied"] == ["file"] and second["terms"]["not_found"] == ["file"]
    r = client.post("/translate_file", files={"file": ("a.txt", b"Open the file in Nextcloud.\n")},
                    data={"source": "en", "target": "de", "glossary": '{"file": "Akte"}',
                          "do_not_translate": '["Nextcloud"]'})
    assert r.status_code == 200, r.text
    text = client.get(r.json()["translatedFileUrl"]).text
    assert "Akte" in text and "Nextcloud" in text


@pytest.mark.parametrize("body,message", [
    ({"glossary": {"file": ""}}, "target term of 'file': must be a non-empty string"),
    ({"glossary": {"": "x"}}, "non-empty"),
    ({"glossary": "{bad"}, "glossary: a JSON object"),
    ({"do_not_translate": [1]}, "do_not_translate"),
    ({"glossary": {"a\tb": "c"}}, "tab"),
    ({"glossary": {f"t{k}": "x" for k in range(5001)}}, "at most 5,000"),
    ({"glossary_id": "00000000-0000-0000-0000-000000000000"}, "no glossary"),
])
def test_bad_terms_are_a_4xx_that_says_why(client, body, message):
    r = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "de", **body})
    assert r.status_code == 400 and message in r.json()["error"], r.text


def test_stored_glossaries_in_deepls_shape(client):
    auth = {"Authorization": "DeepL-Auth-Key anything"}  # a server without keys accepts any
    r = client.post("/v2/glossaries", json={"name": "Product", "source_lang": "EN", "target_lang": "DE",
                                            "entries": ENTRIES, "entries_format": "tsv"}, headers=auth)
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["entry_count"] == 2 and info["ready"] and (info["source_lang"], info["target_lang"]) == ("en", "de")
    gid = info["glossary_id"]
    assert client.get(f"/v2/glossaries/{gid}/entries", headers=auth).text == ENTRIES
    assert gid in [g["glossary_id"] for g in client.get("/v2/glossaries", headers=auth).json()["glossaries"]]
    r = client.post("/v2/translate", json={"text": ["Open the file."], "source_lang": "EN", "target_lang": "DE",
                                           "glossary_id": gid}, headers=auth)
    assert r.status_code == 200 and "Akte" in r.json()["translations"][0]["text"], r.text
    assert r.json()["translations"][0]["detected_source_language"] == "EN"
    lt = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "de", "glossary_id": gid})
    assert lt.json()["terms"]["applied"] == ["file"]
    assert client.get("/v2/glossary-language-pairs", headers=auth).json() == \
        {"supported_languages": [{"source_lang": "en", "target_lang": "de"}]}
    assert client.delete(f"/v2/glossaries/{gid}", headers=auth).status_code == 204
    gone = client.get(f"/v2/glossaries/{gid}", headers=auth)
    assert gone.status_code == 404 and "Glossary not found" in gone.json()["message"]


@pytest.mark.parametrize("fields,message", [
    ({"entries": "file\tAkte\nfile\tDatei"}, "appears twice"),
    ({"entries": "file Akte"}, "a tab"),
    ({"entries": "file\t\n"}, "non-empty"),
    ({"entries": ""}, "no entries"),
    ({"target_lang": "FR"}, "Unsupported glossary language pair"),
    ({"name": ""}, "'name' not specified"),
    ({"name": "n" * 1025}, "'name' has 1,025 characters; at most 1,024"),
    ({"entries_format": "xlsx"}, "'tsv' or 'csv'"),
])
def test_glossary_errors_in_deepls_shape(client, fields, message):
    body = {"name": "G", "source_lang": "EN", "target_lang": "DE", "entries": ENTRIES, **fields}
    r = client.post("/v2/glossaries", json=body, headers={"Authorization": "DeepL-Auth-Key k"})
    assert r.status_code == 400 and message in r.json()["message"] and "error" not in r.json(), r.text


def test_one_keys_glossaries_are_not_anothers(tiny_sentinel_checkpoint, tmp_path):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1,
                        api_keys=["alice", "bob"], keys_db=str(tmp_path / "keys.db"))
    with ready_client(settings) as c:
        alice, bob = ({"Authorization": f"DeepL-Auth-Key {k}"} for k in ("alice", "bob"))
        gid = c.post("/v2/glossaries", json={"name": "A", "source_lang": "en", "target_lang": "de",
                                             "entries": ENTRIES}, headers=alice).json()["glossary_id"]
        assert c.get(f"/v2/glossaries/{gid}", headers=alice).status_code == 200
        assert c.get(f"/v2/glossaries/{gid}", headers=bob).status_code == 404
        assert c.get("/v2/glossaries", headers=bob).json() == {"glossaries": []}
        assert c.delete(f"/v2/glossaries/{gid}", headers=bob).status_code == 404
        wrong = c.get("/v2/glossaries", headers={"Authorization": "DeepL-Auth-Key mallory"})
        assert wrong.status_code == 403 and wrong.json() == {"message": "Invalid API key"}
        assert c.get("/v2/glossaries").status_code == 403
        r = c.post("/translate", json={"q": "Open the file.", "source": "en", "target": "de", "glossary_id": gid,
                                       "api_key": "alice"})
        assert r.status_code == 200 and r.json()["terms"]["applied"] == ["file"]


def test_what_weblates_deepl_backend_sends(client):
    """Weblate (weblate/machinery/deepl.py, API URL set to this server's /v2/) asks for languages with
    query parameters and translates with its placeholders as <x id="N"></x> and tag_handling xml."""
    auth = {"Authorization": "DeepL-Auth-Key weblate"}
    assert client.get("/v2/languages", params={"type": "target"}, headers=auth).json() == \
        [{"language": "DE", "name": "German", "supports_formality": False}]
    r = client.post("/v2/translate", headers=auth, json={
        "text": ['Open <x id="7"></x> and click <x id="19"></x>.'], "source_lang": "EN", "target_lang": "DE",
        "formality": "default", "tag_handling": "xml", "ignore_tags": ["x"]})
    assert r.status_code == 200, r.text
    text = r.json()["translations"][0]["text"]
    assert text.count('<x id="7"></x>') == 1 and text.count('<x id="19"></x>') == 1, text


def translated_items(client) -> float:
    lines = [x for x in client.get("/metrics").text.splitlines() if x.startswith("nmt_translated_items_total")]
    return sum(float(line.split()[-1]) for line in lines)


def test_deepls_options_for_reading_a_text_are_followed_or_refused(client):
    """split_sentences ('1', 'nonewlines', '0'), ignore_tags and formality do what DeepL's API says
    or get DeepL's 400; none is accepted and then ignored."""
    # never the same text twice, so that none comes from the cache (a number would be masked)
    calls = iter(["red", "green", "blue", "black", "white", "brown", "grey", "pink", "gold", "silver"])

    def sequences(text: str, **options) -> tuple[float, str]:  # (sequences the model translated, the answer)
        text = text.replace("N", next(calls))
        before = translated_items(client)
        r = client.post("/v2/translate", json={"text": [text], "source_lang": "EN", "target_lang": "DE", **options})
        assert r.status_code == 200, r.text
        return translated_items(client) - before, r.json()["translations"][0]["text"]

    two = "Open the N file. Save the N file."
    assert sequences(two)[0] == 2 and sequences(two, split_sentences="1")[0] == 2
    assert sequences(two, split_sentences="0")[0] == 1
    lines = "Open the N file\nand save it"
    assert sequences(lines)[0] == 2 and sequences(lines, split_sentences="nonewlines")[0] == 1
    assert sequences("<p>Open file N\nand save it</p>", tag_handling="xml")[0] == 1  # DeepL's default with tags
    count, text = sequences("<p>Open <keep>the file</keep> N.</p>", tag_handling="xml", ignore_tags="keep,other")
    assert "<keep>the file</keep>" in text and count == 1
    assert sequences("<p>Open the file.</p>", tag_handling="xml", ignore_tags=["p"]) == (0, "<p>Open the file.</p>")
    assert sequences(two, formality="prefer_less")[0] == 2
    for fields, message in [({"split_sentences": "2"}, "Value for 'split_sentences' not supported: '2'"),
                            ({"formality": "more"}, "'formality' is not supported for given 'target_lang'"),
                            ({"formality": "casual"}, "Value for 'formality' not supported: 'casual'"),
                            ({"ignore_tags": "a b"}, "'a b' is not a tag name"),
                            ({"ignore_tags": [3]}, "Value for 'ignore_tags' not supported")]:
        r = client.post("/v2/translate", json={"text": ["Open it."], "target_lang": "DE", "tag_handling": "xml",
                                               **fields})
        assert r.status_code == 400 and message in r.json()["message"], r.text


DEEPL_ROUND_TRIP = """
import sys, deepl
t = deepl.Translator("my-key", server_url=sys.argv[1])
assert [l.code for l in t.get_source_languages()] == ["EN"]
assert [l.code for l in t.get_target_languages()] == ["DE"]
assert isinstance(t.translate_text("Open the file.", target_lang="DE").text, str)
out = t.translate_text("<p>Open <keep>the file</keep>.\\nNow.</p>", target_lang="DE", tag_handling="xml",
                       ignore_tags=["keep"], split_sentences="nonewlines", formality="prefer_more")
assert "<keep>the file</keep>" in out.text, out.text
try:
    t.translate_text("Open the file.", target_lang="DE", formality="more")
    raise SystemExit("formality 'more' was accepted by a server whose models have no formality")
except deepl.DeepLException as e:
    assert "formality" in str(e), e
g = t.create_glossary("Product", source_lang="EN", target_lang="DE", entries={"file": "Akte", "Nextcloud": "Nextcloud"})
assert g.entry_count == 2 and g.source_lang == "EN" and g.target_lang == "DE"
out = t.translate_text(["Open the file.", "Save it in Nextcloud."], source_lang="EN", target_lang="DE", glossary=g)
assert "Akte" in out[0].text and "Nextcloud" in out[1].text and out[0].detected_source_lang == "EN", out
assert [x.glossary_id for x in t.list_glossaries()] == [g.glossary_id]
assert t.get_glossary_entries(g) == {"file": "Akte", "Nextcloud": "Nextcloud"}
assert t.get_glossary(g.glossary_id).name == "Product"
assert t.get_usage().character.count > 0 and not t.get_usage().any_limit_reached
assert [(p.source_lang, p.target_lang) for p in t.get_glossary_languages()] == [("en", "de")]
with open(sys.argv[2] + "/notes.txt", "wb") as f:
    f.write(b"Open the file.\\nSave it in Nextcloud.\\n")
with open(sys.argv[2] + "/notes.txt", "rb") as f, open(sys.argv[2] + "/notes_de.txt", "wb") as out:
    status = t.translate_document(f, out, source_lang="EN", target_lang="DE", glossary=g)
assert status.done and 33 <= status.billed_characters <= 37, status.billed_characters  # the text, lines or not
translated = open(sys.argv[2] + "/notes_de.txt", encoding="utf-8").read()
assert translated.count("\\n") == 2 and "Akte" in translated and "Nextcloud" in translated, translated
handle = t.translate_document_upload(b"Open the file.", target_lang="DE", filename="x.txt")
assert t.translate_document_get_status(handle).done and t.translate_document_download(handle).content
try:
    t.translate_document_get_status(deepl.DocumentHandle(handle.document_id, "0" * 16))
    raise SystemExit("a document was found with a wrong key")
except deepl.DeepLException:
    pass
try:
    t.translate_document_upload(b"Open the file.", target_lang="DE", filename="x.txt", output_format="docx")
    raise SystemExit("a text file was promised as a docx")
except deepl.DeepLException as e:
    assert "output_format" in str(e), e
c = deepl.DeepLClient("my-key", server_url=sys.argv[1])  # the newer client: several glossaries, model types
h = c.create_glossary("Verbs", source_lang="EN", target_lang="DE", entries={"Save": "Sichere"})
out = c.translate_text("Save the file.", source_lang="EN", target_lang="DE", glossary_ids=[g, h],
                       model_type="quality_optimized")
assert "Akte" in out.text and "Sichere" in out.text and out.model_type_used == "latency_optimized", out
handle = c.translate_document_upload(b"Save the file.", source_lang="EN", target_lang="DE", filename="y.txt",
                                     glossary_ids=[g, h])  # sent comma-separated in the form
translated = c.translate_document_download(handle).content.decode()
assert "Akte" in translated and "Sichere" in translated, translated
k = c.create_glossary("Other", source_lang="EN", target_lang="DE", entries={"file": "Datei"})
for options, named in [({"glossary_ids": [g, k]}, "both have 'file'"), ({"style_rule": "s"}, "style_id"),
                       ({"custom_instructions": ["Be formal."]}, "custom_instructions"),
                       ({"translation_memory": "m"}, "translation_memory_id"), ({"model_type": "best"}, "model_type")]:
    try:
        c.translate_text("Save the file.", source_lang="EN", target_lang="DE", **options)
        raise SystemExit(f"{options} was accepted, and would have had no effect")
    except deepl.DeepLException as e:
        assert named in str(e), e
try:
    c.translate_document_upload(b"Save the file.", target_lang="DE", filename="y.txt", style_rule="s")
    raise SystemExit("a document with a style rule was accepted")
except deepl.DeepLException as e:
    assert "style_id" in str(e), e
t.delete_glossary(g)
try:
    t.get_glossary(g.glossary_id)
    raise SystemExit("the deleted glossary is still there")
except deepl.GlossaryNotFoundException:
    pass
print("ok")
"""


@pytest.mark.e2e
def test_the_deepl_client_round_trip_against_a_real_server(tiny_sentinel_checkpoint, tmp_path):
    env = {"NMT_MODEL_DIRS": str(tiny_sentinel_checkpoint), "NMT_WORKERS": "1", "NMT_THREADS_PER_WORKER": "1",
           "NMT_KEYS_DB": str(tmp_path / "keys.db"), "NMT_DETECT_LANGUAGES": "en,de"}
    with running_server(env) as (url, _):
        run = subprocess.run([sys.executable, "-c", DEEPL_ROUND_TRIP, url, str(tmp_path)], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_a_model_that_reads_annotations_gets_glossaries_inline_in_every_api(tmp_path):
    """A model trained with inline term annotations reads glossary terms that way; where it does
    not write a term (a random model never does), the sentence goes again with the term as a
    sentinel, so every API still returns the term and reports it applied."""
    from tests.conftest import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "annotating", sentinels=True, term_annotations=True)
    settings = Settings(model_dirs=[str(checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        keys_db=str(tmp_path / "keys.db"))

    def retries() -> float:
        lines = client.get("/metrics").text.splitlines()
        return sum(float(line.split()[-1]) for line in lines if line.startswith("nmt_term_retries_total"))

    with ready_client(settings) as client:
        body = {"source": "en", "target": "de", "glossary": {"file": "Akte"}, "do_not_translate": ["Nextcloud"]}
        r = client.post("/v1/translate", json={**body, "text": ["Open the file in Nextcloud.", "Hello."]})
        assert r.status_code == 200, r.text
        first, second = r.json()["translations"]
        assert "Akte" in first["text"] and "Nextcloud" in first["text"] and "\ue020" not in first["text"]
        assert first["terms"]["applied"] == ["file", "Nextcloud"] and second["terms"]["not_found"] == ["file", "Nextcloud"]
        assert retries() == 1  # the first text only
        for fmt in ("text", "html"):
            r = client.post("/translate", json={**body, "q": "Open the <b>file</b> in Nextcloud.", "format": fmt})
            assert r.status_code == 200, r.text
            assert "Akte" in r.json()["translatedText"] and r.json()["terms"]["applied"] == ["file", "Nextcloud"]
        r = client.post("/translate_file", files={"file": ("a.txt", b"Open the file in Nextcloud.\n")},
                        data={"source": "en", "target": "de", "glossary": '{"file": "Akte"}'})
        assert r.status_code == 200, r.text
        assert "Akte" in client.get(r.json()["translatedFileUrl"]).text
        assert retries() == 4


def test_a_document_upload_has_the_file_cap_not_the_body_cap(client):
    """DeepL's POST /v2/document takes files as /translate_file does: up to NMT_MAX_FILE_BYTES."""
    data = b"Open the file.\n" * (350_000)  # 5.3 MB: past NMT_MAX_BODY_BYTES (4 MiB), within the file cap
    r = client.post("/v2/document", files={"file": ("big.txt", data)}, data={"target_lang": "DE"})
    assert "NMT_MAX_BODY_BYTES" not in r.text, r.text[:300]
    r = client.post("/v2/document", files={"file": ("big.txt", data * 4)}, data={"target_lang": "DE"})
    assert r.status_code == 413 and "NMT_MAX_FILE_BYTES" in r.json()["message"], r.text[:300]
