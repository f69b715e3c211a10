"""Sources in capitals: read in sentence case, translated, written in capitals (model/casing.py)."""

from __future__ import annotations

import pytest

from model import casing
from model.protect import sentinel
from model.translator import Translator
from tests.conftest import TINY_TEXT, make_tiny_checkpoint


@pytest.mark.parametrize("text, shouting", [
    ("SAVE CHANGES", True),
    ("WARNING: THIS WILL DELETE ALL FILES!", True),
    (f"DELETE {sentinel(0)} FILES?", True),
    ("ERROR 404: FILE NOT FOUND", True),
    ("USB", False),  # one word: an acronym as often as not
    ("OK", False),
    ("A B C", False),  # no word of two letters
    ("Save changes", False),
    ("SAVE changes", False),
    ("Open the PDF FILE", False),
    ("", False),
])
def test_what_counts_as_written_in_capitals(text, shouting):
    assert casing.is_shouting(text) is shouting


def test_sentence_case_starts_each_sentence_with_a_capital():
    assert casing.sentence_case("WARNING: THIS WILL DELETE ALL FILES! ARE YOU SURE?") == \
        "Warning: this will delete all files! Are you sure?"
    assert casing.sentence_case('"QUOTED." (ALSO THIS.)') == '"Quoted." (Also this.)'
    assert casing.sentence_case(f"DELETE {sentinel(3)} FILES") == f"Delete {sentinel(3)} files"


def test_english_i_stays_a_capital_in_english_only():
    text = "IF I CLOSE THIS, WILL I LOSE MY WORK? I'M SURE I'D KNOW. IT IS IN MY BAG."
    assert casing.sentence_case(text, "en") == "If I close this, will I lose my work? I'm sure I'd know. It is in my bag."
    assert casing.sentence_case("PIZZA I FUNGHI", "it") == "Pizza i funghi"


def test_shout_writes_german_in_capitals():
    assert casing.shout("Änderungen speichern, Straße") == "ÄNDERUNGEN SPEICHERN, STRASSE"
    assert casing.shout(sentinel(1)) == sentinel(1)  # sentinels have no case


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    """A tiny random model whose vocabulary spells capitals, has byte pieces and sentinels."""
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-bytes"), sentinels=True, byte_fallback=True,
                                      text=TINY_TEXT + [line.upper() for line in TINY_TEXT])
    return Translator.load(checkpoint, device="cpu", dtype="float32")


def test_a_source_in_capitals_is_translated_as_its_sentence_case_and_written_in_capitals(translator):
    [loud, quiet] = translator.translate(["OPEN THE FILE AND SAVE YOUR CHANGES.", "Open the file and save your changes."],
                                         beam_size=2, n_best=2, max_length=8, attention=True)
    assert loud.source_tokens == quiet.source_tokens  # what the model read
    for a, b in zip(loud.hypotheses, quiet.hypotheses):
        assert a.token_ids == b.token_ids and a.tokens == b.tokens
        assert a.text == casing.shout(b.text)


def test_token_ids_in_capitals_are_read_in_sentence_case_too(translator):
    """The service sends token ids to its workers: the same rule applies to them."""
    ids = translator.encode("CLICK THE BUTTON TO PRINT THE DOCUMENT.")
    [by_ids] = translator.translate([ids], beam_size=2, max_length=8)
    [by_text] = translator.translate(["Click the button to print the document."], beam_size=2, max_length=8)
    assert by_ids.hypotheses[0].text == casing.shout(by_text.hypotheses[0].text)


def test_one_word_in_capitals_is_read_as_written(translator):
    [result] = translator.translate(["USB"], beam_size=1, max_length=4)
    assert result.source_tokens == translator.tokenizer.source_pieces(translator.encode("USB"))


def test_spans_in_a_source_in_capitals_come_back_as_written(translator):
    source = "DELETE %(count)s FILES FROM <b>{folder_name}</b>?"
    [result] = translator.translate([source], beam_size=2, max_length=12)
    [quiet] = translator.translate(["Delete %(count)s files from <b>{folder_name}</b>?"], beam_size=2,
                                   max_length=12)
    text, rest = result.hypotheses[0].text, quiet.hypotheses[0].text
    for span in ("%(count)s", "<b>", "{folder_name}", "</b>"):
        assert text.count(span) == 1  # the repair puts back what the random model drops
        text, rest = text.replace(span, "\0"), rest.replace(span, "\0")
    assert text == rest.upper()


def test_characters_the_vocabulary_cannot_spell_come_back_as_written(translator, tiny_sentinel_checkpoint):
    """Emoji and other scripts are copied as spans, not spelled byte by byte; with byte pieces in
    the vocabulary (the shipped model's) and without (<unk>)."""
    source = "Hello world 😀, this is Москва."
    for model in (translator, Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32")):
        assert model.tokenizer.cannot_spell("😀") and not model.tokenizer.cannot_spell("o")
        [result] = model.translate([source], beam_size=2, max_length=12)
        text = result.hypotheses[0].text
        assert text.count("😀") == 1 and text.count("Москва") == 1, text
        assert "\ufffd" not in text and "<unk>" not in text


def test_german_in_capitals_gets_its_nouns_back_from_the_vocabulary():
    """A German sentence in capitals is read with its nouns capitalized where the vocabulary spells
    them in fewer pieces so (the shipped model's joint vocabulary)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file="checkpoints/en-de/source.spm")
    pieces = lambda word: len(sp.encode(word))  # noqa: E731
    assert casing.sentence_case("BITTE GEBEN SIE IHR PASSWORT EIN. DIE DATEI WURDE GESPEICHERT.", "de", pieces) == \
        "Bitte geben sie ihr Passwort ein. Die Datei wurde gespeichert."
    assert casing.sentence_case("BITTE GEBEN SIE IHR PASSWORT EIN.", "de") == "Bitte geben sie ihr passwort ein."
    assert casing.sentence_case("PLEASE ENTER YOUR PASSWORD.", "en", pieces) == "Please enter your password."
