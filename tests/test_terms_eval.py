"""`nmt eval-terms` in both directions: glossary sets built from the Ding dictionary the right way
round, measured on a tiny random model (its sentinels write every term as given)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from training.corpus import DING_FILE, DING_PACKAGE
from training.terms_eval import evaluate, glossary_candidates, lemma_match

DING = """# a few lines in the format of trans-de-en
Datei {f}; Akte {f} :: file; record
Ordner {m} | Ordner {pl} :: folder | folders
speichern {vt} :: to save
die :: the
"""

# (English, German) held-out pairs: the reference of each holds the other side of one gloss
PAIRS = [
    ("Open the file now.", "Öffnen Sie jetzt die Datei."),
    ("Save it in the folder.", "Speichern Sie es im Ordner."),
    ("The Firefox window is open.", "Das Firefox Fenster ist offen."),
    ("Print the document.", "Drucken Sie das Dokument."),
]


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path]:
    data, cache = tmp_path / "corpus", tmp_path / "cache"
    data.mkdir()
    for name in ("test_sw", "test_general"):
        (data / f"{name}.en").write_text("".join(en + "\n" for en, _ in PAIRS))
        (data / f"{name}.de").write_text("".join(de + "\n" for _, de in PAIRS))
    ding = cache / "extract" / f"{DING_PACKAGE}_1.0_all" / DING_FILE
    ding.parent.mkdir(parents=True)
    ding.write_text(DING)
    return data, cache


def reversed_model(checkpoint: Path, out: Path) -> Path:
    """The tiny model's copy that says it translates German into English."""
    shutil.copytree(checkpoint, out)
    metadata = json.loads((out / "metadata.json").read_text())
    (out / "metadata.json").write_text(json.dumps({**metadata, "source_lang": "de", "target_lang": "en"}))
    return out


def test_glossary_candidates_take_the_longest_gloss_in_source_and_reference():
    glosses = [("Datei", "file"), ("die Datei", "the file"), ("Ordner", "folder")]
    found = glossary_candidates(["Öffnen Sie die Datei.", "Kein Treffer."], ["Open the file.", "No match."], glosses)
    assert found == [(0, ("die Datei", "the file"))]


def test_lemma_match_takes_off_the_target_languages_endings():
    assert lemma_match("Saving the files", "save file", "en")
    assert not lemma_match("Saving the records", "save file", "en")
    assert lemma_match("Die Dateien öffnen", "Datei", "de")
    assert not lemma_match("Die Akten öffnen", "Datei", "de")


def test_a_de_en_model_is_measured_on_german_sources_with_english_terms(tiny_sentinel_checkpoint, corpus, tmp_path):
    data, cache = corpus
    model = reversed_model(tiny_sentinel_checkpoint, tmp_path / "de-en")
    report = evaluate(str(model), str(data), str(cache), beam=2, limit=10, threads=1, dtype="float32")
    assert report["direction"] == "de-en"
    examples = report["glossary"]["examples"]
    # German sources, English terms; "die" -> "the" is a stopword and never a glossary entry
    assert examples and {e["source"] for e in examples} <= {de for _, de in PAIRS}
    assert all(next(iter(e["term"])) in ("Datei", "Ordner") for e in examples)
    assert all(set(e["term"].values()) <= {"file", "folder"} for e in examples)
    # the sentinels carry a term through the random model as given
    assert report["glossary"]["term_exact_pct"] == 100.0
    assert all(e["term"][next(iter(e["term"]))] in e["with"] for e in examples)


def test_an_en_de_model_is_measured_on_english_sources_with_german_terms(tiny_sentinel_checkpoint, corpus):
    data, cache = corpus
    report = evaluate(str(tiny_sentinel_checkpoint), str(data), str(cache), beam=2, limit=10, threads=1,
                      dtype="float32")
    assert report["direction"] == "en-de"
    examples = report["glossary"]["examples"]
    assert examples and {e["source"] for e in examples} <= {en for en, _ in PAIRS}
    assert all(set(e["term"].values()) <= {"Datei", "Ordner"} for e in examples)
    assert report["glossary"]["term_exact_pct"] == 100.0


def test_other_language_pairs_are_refused(tiny_sentinel_checkpoint, corpus, tmp_path):
    data, cache = corpus
    model = reversed_model(tiny_sentinel_checkpoint, tmp_path / "fr-en")
    metadata = json.loads((model / "metadata.json").read_text())
    (model / "metadata.json").write_text(json.dumps({**metadata, "source_lang": "fr"}))
    with pytest.raises(SystemExit, match="en-de or de-en"):
        evaluate(str(model), str(data), str(cache), beam=2, limit=10, threads=1, dtype="float32")
