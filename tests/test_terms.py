"""Terminology (model/terms.py): glossary and do-not-translate terms found as whole words, masked
as protected spans, and back in the translation: the target term as given, a kept term byte for
byte, even from a random model (the repair puts a dropped sentinel back)."""

from __future__ import annotations

import pytest

from app.glossaries import inline_terminology, parse_entries
from model import protect
from model.terms import TermError, Terminology
from model.translator import Translator


def test_terms_are_whole_words_longest_first_outside_other_spans():
    terms = Terminology({"file": "Akte", "file manager": "Dateiverwaltung"}, ["Nextcloud"])
    masked = protect.mask("The File manager opens a file, not profile or <file> or %file in NEXTCLOUD.", terms=terms)
    # the longest entry first; case ignored; a kept term as the source writes it; %f is a placeholder
    assert masked.spans == ["Dateiverwaltung", "Akte", "<file>", "%f", "NEXTCLOUD"]
    assert "profile" in masked.text and "ile in" in masked.text  # not whole words, or inside a span
    assert masked.terms == {0: "file manager", 1: "file", 4: "Nextcloud"}
    assert protect.unmask(masked.text, masked.spans) == \
        "The Dateiverwaltung opens a Akte, not profile or <file> or %file in NEXTCLOUD."  # kept as written


def test_term_lists_are_checked():
    with pytest.raises(TermError, match="non-empty"):
        Terminology({"file": ""})
    with pytest.raises(TermError, match="whitespace"):
        Terminology({}, [" Nextcloud"])
    with pytest.raises(TermError, match="appears twice"):
        parse_entries("file\tAkte\nfile\tDatei\n")
    with pytest.raises(TermError, match="tab"):
        parse_entries("file Akte\n")
    assert parse_entries('file,Akte\n"a, b",c\n', "csv") == {"file": "Akte", "a, b": "c"}
    assert inline_terminology('{"file": "Akte"}', "Nextcloud") == Terminology({"file": "Akte"}, ["Nextcloud"])
    assert inline_terminology(None, '["A", "B"]').keep == ["A", "B"]
    assert inline_terminology(None, None) is None
    with pytest.raises(TermError, match="JSON object"):
        inline_terminology("{not json", None)
    with pytest.raises(TermError, match="list of terms"):
        inline_terminology(None, [1, 2])


def test_a_random_model_still_writes_every_term(tiny_sentinel_checkpoint):
    translator = Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32")
    terms = Terminology({"file": "Akte"}, ["Nextcloud"])
    results = translator.translate(["Open the file in Nextcloud.", "Hello world."], terms=terms)
    assert "Akte" in results[0].hypotheses[0].text and "Nextcloud" in results[0].hypotheses[0].text
    assert results[0].terms == {"applied": ["file", "Nextcloud"], "not_applied": [], "not_found": []}
    assert results[1].terms == {"applied": [], "not_applied": [], "not_found": ["file", "Nextcloud"]}
    plain = translator.translate(["Open the file in Nextcloud."])[0]
    assert plain.terms is None


def test_a_model_without_sentinels_places_terms_by_attention(tiny_checkpoint):
    """An imported model has no sentinel pieces: its terms are taken out of the source and put
    back where the attention points, like its placeholders."""
    translator = Translator.load(tiny_checkpoint, device="cpu", dtype="float32")
    assert not translator.tokenizer.has_sentinels
    [result] = translator.translate(["Open the file in Nextcloud."], terms=Terminology({"file": "Akte"}, ["Nextcloud"]))
    assert result.terms == {"applied": ["file", "Nextcloud"], "not_applied": [], "not_found": []}
    assert "Akte" in result.hypotheses[0].text and "Nextcloud" in result.hypotheses[0].text
