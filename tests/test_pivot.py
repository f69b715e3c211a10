"""Pivoting: with fr -> en and en -> de served but no fr -> de, /languages lists fr -> de and
/translate and /v1/translate translate through English, the first leg's translation through the
second, as Argos does; a glossary's target terms survive the second leg."""

from __future__ import annotations

import json
import shutil

import pytest

from app.settings import Settings
from tests.conftest import ready_client


@pytest.fixture(scope="module")
def client(tiny_sentinel_checkpoint, tmp_path_factory):
    fr_en = tmp_path_factory.mktemp("fr-en") / "ckpt"
    shutil.copytree(tiny_sentinel_checkpoint, fr_en)
    meta = json.loads((fr_en / "metadata.json").read_text())
    (fr_en / "metadata.json").write_text(json.dumps({**meta, "source_lang": "fr", "target_lang": "en"}))
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint), str(fr_en)], workers=1, threads_per_worker=1,
                        max_wait_ms=2, detect_languages=["en", "de", "fr"])
    with ready_client(settings) as c:
        yield c


def lt(client, q, source, target, **extra):
    r = client.post("/translate", json={"q": q, "source": source, "target": target, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_languages_list_the_pivot_pair(client):
    targets = {lang["code"]: lang["targets"] for lang in client.get("/languages").json()}
    assert targets["fr"] == ["de", "en"] and targets["en"] == ["de"]


def test_translate_goes_through_english(client):
    text = "Open the file."
    middle = lt(client, text, "fr", "en")["translatedText"]
    assert lt(client, text, "fr", "de")["translatedText"] == lt(client, middle, "en", "de")["translatedText"]
    listed = lt(client, [text, "Hello world."], "fr", "de")["translatedText"]
    assert isinstance(listed, list) and listed[0] == lt(client, middle, "en", "de")["translatedText"]
    r = client.post("/v1/translate", json={"text": [text], "source": "fr", "target": "de"})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "fr-de" and r.json()["pivot"] == "en"
    assert r.json()["translations"][0]["text"] == lt(client, middle, "en", "de")["translatedText"]
    assert "pivot" not in client.post("/v1/translate", json={"text": text, "source": "en", "target": "de"}).json()


def test_a_glossary_reaches_through_the_pivot_and_what_is_not_there_yet_says_so(client):
    out = lt(client, "Open the file.", "fr", "de", glossary={"file": "Akte"})
    assert "Akte" in out["translatedText"] and out["terms"]["applied"] == ["file"]
    r = client.post("/v1/translate", json={"text": "Open the file.", "source": "fr", "target": "de", "n_best": 2})
    assert r.status_code == 400 and "through a pivot (fr->en->de)" in r.json()["error"]
    r = client.post("/translate", json={"q": "Open the file.", "source": "fr", "target": "de", "alternatives": 1})
    assert r.status_code == 400 and "pivot" in r.json()["error"]


def test_alignments_through_the_pivot_give_each_leg_and_their_composition(client):
    text = "Open the file and save it."
    r = client.post("/v1/translate", json={"text": text, "source": "fr", "target": "de", "alignments": True})
    assert r.status_code == 200, r.text
    out = r.json()["translations"][0]
    first_id, second_id = out["leg_alignment_ids"]
    first, second, composed = (client.get(f"/v1/alignments/{i}").json() for i in (first_id, second_id,
                                                                                   out["alignment_id"]))
    assert first["model"] == "fr-en" and second["model"] == "en-de" and composed["model"] == "fr-de"
    assert composed["source_tokens"] == first["source_tokens"] and composed["target_tokens"] == second["target_tokens"]
    assert (composed["layers"], composed["heads"]) == (1, 1)
    rows = composed["attention"][0][0]
    assert len(rows) == len(second["target_tokens"]) and all(abs(sum(row) - 1) < 1e-2 for row in rows)
    # word view and hard links work on the composition as on any alignment
    assert client.get(f"/v1/alignments/{out['alignment_id']}", params={"granularity": "word", "hard": True}).json()[
        "hard_alignment"]


def test_a_file_goes_through_english_too(client):
    text = "Open the file.\nClick the button to print the document.\n"
    r = client.post("/translate_file", files={"file": ("notes.txt", text.encode())},
                    data={"source": "fr", "target": "de", "glossary": '{"file": "Akte"}'})
    assert r.status_code == 200, r.text
    out = client.get(r.json()["translatedFileUrl"]).text
    assert out == lt(client, text, "fr", "de", glossary={"file": "Akte"})["translatedText"]
    assert "Akte" in out


def test_deepls_translate_goes_through_english_too(client):
    r = client.post("/v2/translate", json={"text": ["Open the file."], "source_lang": "FR", "target_lang": "DE"},
                    headers={"Authorization": "DeepL-Auth-Key k"})
    assert r.status_code == 200, r.text
    assert r.json()["translations"][0]["text"] == lt(client, "Open the file.", "fr", "de")["translatedText"]
    assert r.json()["translations"][0]["detected_source_language"] == "FR"
