"""Terminology (model/terms.py): glossary and do-not-translate terms found as whole words, masked
as protected spans, and back in the translation: the target term as given, a kept term byte for
byte, even from a random model (the repair puts a dropped sentinel back)."""

from __future__ import annotations

import random
from functools import partial

import pytest

from app.glossaries import inline_terminology, parse_entries
from model import pipeline, protect
from model.pipeline import lacks_terms
from model.results import Translation, terms_first
from model.terms import TERM_CLOSE, TERM_OPEN, Match, TermError, Terminology, annotate, retry_beam_size, term_used
from model.translator import Translator
from tests.conftest import make_tiny_checkpoint
from training.annotate import annotate_corpus, annotate_pair, fitting_terms, gloss_index


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
    # one terminology per source, in one call
    each = translator.translate(["Open the file.", "Open the file.", "Open the file."],
                                terms=[Terminology({"file": "Akte"}), None, Terminology({"file": "Datei"})])
    assert "Akte" in each[0].hypotheses[0].text and "Datei" in each[2].hypotheses[0].text
    assert each[0].terms["applied"] == ["file"] and each[1].terms is None
    with pytest.raises(ValueError, match="2 terminologies for 3 sources"):
        translator.translate(["a", "b", "c"], terms=[None, None])


def test_a_model_without_sentinels_places_terms_by_attention(tiny_checkpoint):
    """An imported model has no sentinel pieces: its terms are taken out of the source and put
    back where the attention points, like its placeholders."""
    translator = Translator.load(tiny_checkpoint, device="cpu", dtype="float32")
    assert not translator.tokenizer.has_sentinels
    [result] = translator.translate(["Open the file in Nextcloud."], terms=Terminology({"file": "Akte"}, ["Nextcloud"]))
    assert result.terms == {"applied": ["file", "Nextcloud"], "not_applied": [], "not_found": []}
    assert "Akte" in result.hypotheses[0].text and "Nextcloud" in result.hypotheses[0].text


def test_a_term_is_used_as_written_or_inflected():
    assert term_used("Speichern Sie die Dateien.", "Datei")
    assert term_used("die neuen Ordner", "neue Ordner")
    assert term_used("im Ordner des Benutzers", "Benutzer")
    assert not term_used("Speichern Sie das Dokument.", "Datei")
    assert not term_used("Ordner neue", "neue Ordner")  # the words in order
    assert not term_used("Die Verschlüsselung wird aktiviert.", "Akten")  # a stem is not any prefix
    with pytest.raises(TermError, match="reserved"):
        Terminology({"file": f"Akte{TERM_OPEN}"})


def test_glossary_terms_go_inline_for_a_model_that_reads_annotations():
    terms = Terminology({"file": "Akte"}, ["Nextcloud"])
    masked = protect.mask("Open the <b>file</b> in Nextcloud.", terms=terms, annotate_glossary=True)
    # the glossary term stays, its target term follows between the tags; the rest are sentinels
    assert masked.text == f"Open the \ue000file{TERM_OPEN} Akte{TERM_CLOSE}\ue001 in \ue002."
    assert masked.spans == ["<b>", "</b>", "Nextcloud"] and masked.terms == {2: "Nextcloud"}
    assert [(a.entry, a.written, a.target) for a in masked.annotations] == [("file", "file", "Akte")]
    # a second try: the annotation becomes a sentinel, as without annotate_glossary
    spans, entries = list(masked.spans), dict(masked.terms)
    again = protect.annotations_as_sentinels(masked.text, masked.annotations, spans, entries)
    assert again == "Open the \ue000\ue003\ue001 in \ue002."
    assert spans == ["<b>", "</b>", "Nextcloud", "Akte"] and entries == {2: "Nextcloud", 3: "file"}
    # a tag character in the input is protected as itself, not read as an annotation
    assert protect.mask(f"a{TERM_OPEN}b").spans == [TERM_OPEN]


def test_of_its_beams_a_translation_takes_the_best_that_writes_the_annotated_term():
    """Every beam comes back when terms are annotated: the best one that writes them (inflected
    or not) wins; only when none does is the text translated again, greedily."""
    masked = protect.mask("Open the file.", terms=Terminology({"file": "Akte"}), annotate_glossary=True)
    assert masked.annotations
    beams = [Translation(text, [], [], -k, -k, True) for k, text in
             enumerate(["Öffne die Dateien.", "Öffne die Akten.", "Akte öffnen.", "Öffne die Aktentasche."])]
    chosen = terms_first(beams, partial(lacks_terms, masked))
    assert [h.text for h in chosen] == ["Öffne die Akten.", "Akte öffnen.", "Öffne die Dateien.",
                                        "Öffne die Aktentasche."]
    assert lacks_terms(masked, "Öffne die Dateien.") and not lacks_terms(protect.mask("Open it."), "Öffne es.")
    assert (retry_beam_size(4), retry_beam_size(4, n_best=3), retry_beam_size(1)) == (1, 3, 1)


def test_training_annotations_use_glosses_the_reference_follows():
    index = gloss_index([("file", "Datei"), ("file", "Akte"), ("file manager", "Dateiverwaltung"), ("save", "sichern")])
    source = "Save the file in the file manager."
    target = "Speichern Sie die Dateien in der Dateiverwaltung."
    fits = fitting_terms(source, target, index)  # "sichern" and "Akte" are not in the reference
    assert [(source[a:b], term) for a, b, _, term in fits] == [("file", "Datei"), ("file manager", "Dateiverwaltung")]
    rng = random.Random(0)
    seen = {annotate_pair(source, fits, rng) for _ in range(30)}  # 1 or 2 of them
    assert seen == {f"Save the {annotate('file', 'Datei')} in the file manager.",
                    f"Save the file in the {annotate('file manager', 'Dateiverwaltung')}.",
                    f"Save the {annotate('file', 'Datei')} in the {annotate('file manager', 'Dateiverwaltung')}."}
    assert fitting_terms("Open file", "Datei öffnen", index) == []  # too short to annotate


def test_training_annotations_favour_terms_other_than_the_usual_one():
    """A folder the reference calls "Verzeichnis" (most say "Ordner") is always annotated; a usual
    one gets another gloss in the annotation and the reference at times, its own at others, so
    that an annotation is followed and does not mean "change this word"."""
    usual = ("Open the folder now.", "Öffnen Sie jetzt den Ordner.")
    unusual = ("Open the folder again.", "Öffnen Sie das Verzeichnis erneut.")
    pairs = [usual] * 30 + [unusual] * 10
    glosses = [("folder", "Ordner"), ("folder", "Verzeichnis")]
    sources, targets, counts = annotate_corpus([s for s, _ in pairs], [t for _, t in pairs], glosses, share=1.0,
                                               seed=1)
    assert sources[30:] == [f"Open the {annotate('folder', 'Verzeichnis')} again."] * 10 and targets[30:] == [unusual[1]] * 10
    assert counts["pairs_with_unusual_terms"] == 10
    swapped = (f"Open the {annotate('folder', 'Verzeichnis')} now.", "Öffnen Sie jetzt den Verzeichnis.")
    kept = (f"Open the {annotate('folder', 'Ordner')} now.", usual[1])
    first = list(zip(sources[:30], targets[:30]))
    assert set(first) == {usual, swapped, kept}
    assert first.count(swapped) == counts["pairs_with_swapped_terms"] > 0
    assert first.count(kept) == counts["pairs_with_usual_terms"] > 0


def test_an_annotating_model_falls_back_to_sentinels_when_it_misses_a_term(tmp_path):
    checkpoint = make_tiny_checkpoint(tmp_path / "annotating", sentinels=True, term_annotations=True)
    translator = Translator.load(checkpoint, device="cpu", dtype="float32")
    assert translator.reads_annotations
    tags = {translator.tokenizer.source_sp.piece_to_id(t) for t in (TERM_OPEN, TERM_CLOSE)}
    masked = pipeline.mask(translator.reader, "Open the file.", Terminology({"file": "Akte"}), annotate=True)
    assert tags <= set(translator.tokenizer.encode_source(masked.text))  # one piece each
    terms = Terminology({"file": "Akte"}, ["Nextcloud"])
    source = "Open the file in Nextcloud."
    # a random model does not write the annotated term: alone, the report says so ...
    [alone] = translator.translate([source], terms=terms, term_method="annotate")
    assert "Akte" not in alone.hypotheses[0].text and alone.terms["not_applied"] == ["file"]
    assert "Nextcloud" in alone.hypotheses[0].text  # kept terms are sentinels either way
    # ... and "auto" translates it again with the term as a sentinel, which cannot miss
    [auto] = translator.translate([source], terms=terms)
    assert "Akte" in auto.hypotheses[0].text and auto.terms["applied"] == ["file", "Nextcloud"]
    assert TERM_OPEN not in auto.hypotheses[0].text
    with pytest.raises(ValueError, match="term_method"):
        translator.translate([source], terms=terms, term_method="magic")


def test_matching_equals_the_whole_word_regex_it_replaced():
    """The unit automaton (model/terms.py) finds what the regex it replaced found: an alternation
    of the escaped entries, longest first, between (?<!\\w) and (?!\\w), case-insensitively, each
    match mapped to its entry. 3,000 random glossaries and texts over an alphabet of words,
    spaces, hyphens and dots (ASCII: the regex broke on "İ")."""
    import random
    import re

    def regex_find(glossary: dict[str, str], keep: list[str], text: str) -> list[Match]:
        entries = sorted([(s, t, s) for s, t in glossary.items()] + [(k, None, k) for k in keep], key=lambda e: -len(e[0]))
        pattern = re.compile("|".join(f"(?<!\\w){re.escape(s)}(?!\\w)" for s, _, _ in entries), re.IGNORECASE)
        by_folded = {s.casefold(): (t, e) for s, t, e in reversed(entries)}
        return [Match(m.start(), m.end(), m.group() if by_folded[m.group().casefold()][0] is None
                      else by_folded[m.group().casefold()][0], by_folded[m.group().casefold()][1],
                      by_folded[m.group().casefold()][0] is not None) for m in pattern.finditer(text)]

    rng = random.Random(1)
    pieces = ["a", "b", "A", " ", "-", ".", "ab", "Ab", "x y"]

    def phrase(most: int) -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(1, most))).strip() or "a"

    compared = 0
    for _ in range(3000):
        glossary = {phrase(4): f"T{i}" for i in range(rng.randint(0, 3))}
        keep = [k for k in dict.fromkeys(phrase(3) for _ in range(rng.randint(0, 3))) if k not in glossary]
        if not glossary and not keep:
            continue
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 20)))
        assert Terminology(glossary, keep).find(text) == regex_find(glossary, keep, text), (glossary, keep, text)
        compared += 1
    assert compared > 2500
