"""Accelerator marks: taken out before the model reads a string, put back by the attention."""

from __future__ import annotations

import numpy as np
import pytest

from model import accelerators
from model.accelerators import Marked
from model.translator import Translator
from tests.conftest import TINY_TEXT, make_tiny_checkpoint


@pytest.mark.parametrize("text, found", [
    ("&File", Marked("File", "&", 0)),
    ("Save &As...", Marked("Save As...", "&", 1)),
    ("_Open the file", Marked("Open the file", "_", 0)),
    ("Open ~Recent", Marked("Open Recent", "~", 1)),
    ("Q&A session", None),  # inside a word
    ("R&&D", None),
    ("file_name is wrong", None),
    ("_italic_ text", None),  # emphasis
    ("&Open &Close", None),  # two: which one is meant is unclear
    ("Tom & Jerry", None),  # not before a letter
    ("~/Documents", None),
    ("No mark here.", None),
])
def test_which_marks_count(text, found):
    assert accelerators.find(text) == found


def test_the_mark_goes_on_the_word_that_attends_most_to_the_marked_word():
    source = ["▁Save", "▁As", "...", "</s>"]
    target = ["▁Speicher", "n", "▁unter", "▁..."]
    attention = np.zeros((5, 4), dtype=np.float32)  # (target steps, source pieces)
    attention[0, 0] = attention[2, 1] = 1.0  # "unter" looks at "As"
    marked = Marked("Save As...", "&", 1)
    assert accelerators.place("Speichern unter ...", target, attention, source, marked) == "Speichern &unter ..."
    # without attention, or on words without letters first: the first word with a letter
    assert accelerators.place("Speichern unter ...", target, None, source, marked) == "&Speichern unter ..."
    assert accelerators.place("... (Datei)", ["▁...", "▁(", "Datei", ")"], None, source, marked) == "... (&Datei)"
    assert accelerators.place("123", ["▁123"], None, source, marked) == "123"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random model whose vocabulary spells capitals, has byte pieces and sentinels."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-marks"), sentinels=True, byte_fallback=True,
                                text=TINY_TEXT + [line.upper() for line in TINY_TEXT])


@pytest.fixture(scope="module")
def translator(checkpoint):
    return Translator.load(checkpoint, device="cpu", dtype="float32")


@pytest.mark.parametrize("source, plain", [
    ("Open the &file and save your changes.", "Open the file and save your changes."),
    ("_OPEN THE FILE AND SAVE YOUR CHANGES.", "Open the file and save your changes."),
])
def test_the_model_reads_the_string_without_its_mark_and_the_translation_gets_it_once(translator, source, plain):
    mark = "&" if "&" in source else "_"
    [marked, unmarked] = translator.translate([source, plain], beam_size=2, n_best=2, max_length=10)
    assert marked.source_tokens == unmarked.source_tokens  # what the model read
    for a, b in zip(marked.hypotheses, unmarked.hypotheses):
        assert a.token_ids == b.token_ids
        if any(c.isalpha() for c in b.text):
            assert a.text.count(mark) == 1 and a.text[a.text.index(mark) + 1].isalpha()
            assert a.text.replace(mark, "").lower() == b.text.lower()


def test_the_service_does_the_same_in_its_workers(checkpoint):
    """The service sends token ids to its workers: marks and capitals are found there too."""
    from app.settings import Settings
    from tests.conftest import ready_client

    sources = ["Open the &file and save your changes.", "CLICK THE BUTTON TO PRINT THE DOCUMENT."]
    settings = Settings(model_dirs=[str(checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2)
    with ready_client(settings) as client:
        body = client.post("/v1/translate", json={"text": sources, "source": "en", "target": "de"}).json()
        answers = [t["text"] for t in body["translations"]]
        answers += [client.post("/translate", json={"q": s, "source": "en", "target": "de"}).json()["translatedText"]
                    for s in sources]
    for marked, loud in zip(answers[0::2], answers[1::2]):
        assert marked.count("&") == 1 and marked[marked.index("&") + 1].isalpha(), marked
        assert loud == loud.upper() and loud != loud.lower(), loud
