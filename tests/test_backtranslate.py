"""Back-translation: monolingual sentences from fortune files, the reverse model's translations,
and a run that trains on them in one direction only."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_tiny_checkpoint
from training import train
from training.backtranslate import (
    backtranslate,
    backtranslated_files,
    build_monolingual,
    cookie_sentences,
    read_cookies,
    wordnet_examples,
)

GERMAN_FORTUNES = """Ein Vorurteil ist ein Irrtum, der Wurzeln geschlagen hat.
\t\t-- Unbekannt
%
Bitte fahren Sie vorsichtig. Das Wetter ist heute schlecht.
%
Wer das liest, ist doof.
%
   Ein Gedicht in Zeilen,
   die eingerückt sind,
   gibt keinen Satz.
%
Die Datei /etc/passwd ist wichtig, sagt der Admin.
%
Ein Vorurteil ist ein Irrtum, der Wurzeln geschlagen hat.
%
Kurz.
"""


def test_cookies_give_prose_sentences_without_attribution_layout_or_markup():
    cookies = read_cookies("_\bU_\bn_\bd so geht es weiter mit dem Text.\n%\nZweiter Keks hier ist gut.\n%\n")
    assert cookies == ["Und so geht es weiter mit dem Text.", "Zweiter Keks hier ist gut."]  # overstrike gone
    sentences = [s for c in read_cookies(GERMAN_FORTUNES) for s in cookie_sentences(c)]
    assert sentences == ["Ein Vorurteil ist ein Irrtum, der Wurzeln geschlagen hat.",
                         "Bitte fahren Sie vorsichtig.", "Das Wetter ist heute schlecht.",
                         "Wer das liest, ist doof.",
                         "Ein Vorurteil ist ein Irrtum, der Wurzeln geschlagen hat."]
    # the indented verse, the path and the one-word cookie give nothing; the attribution is dropped


def test_monolingual_sentences_are_unique_and_never_a_held_out_sentence(tmp_path):
    corpus, de_dir, en_dir = tmp_path / "corpus", tmp_path / "de", tmp_path / "en"
    for d in (corpus, de_dir, en_dir):
        d.mkdir()
    (de_dir / "sprueche").write_text(GERMAN_FORTUNES, encoding="utf-8")
    (de_dir / "sprueche.dat").write_bytes(b"\x00\x01")  # strfile's index: not a fortune file
    (de_dir / "art").write_text("Ein Bild aus Zeichen ist das hier.\n", encoding="utf-8")  # skipped by name
    (en_dir / "wisdom").write_text("A dream will always triumph over reality.\n%\nStay away from storms now.\n")
    (corpus / "test_general.de").write_text("Das Wetter ist heute SCHLECHT\n", encoding="utf-8")  # norm_key match
    (corpus / "dev.en").write_text("Something else entirely here.\n")

    stats = build_monolingual(corpus, tmp_path / "cache", {"de": [de_dir], "en": [en_dir]})
    assert (corpus / "mono.de").read_text(encoding="utf-8").splitlines() == [
        "Ein Vorurteil ist ein Irrtum, der Wurzeln geschlagen hat.", "Bitte fahren Sie vorsichtig.",
        "Wer das liest, ist doof."]
    assert (corpus / "mono.de.source").read_text().splitlines() == ["sprueche"] * 3
    assert stats == {"de": {"sentences": 4, "dropped_heldout": 1, "kept": 3},
                     "en": {"sentences": 2, "dropped_heldout": 0, "kept": 2}}
    assert json.loads((corpus / "mono.json").read_text()) == stats


WORDNET = {
    "data.noun": """  1 This software and database is provided "as is" and Princeton makes no warranties.
00001740 03 n 01 entity 0 003 | that which is perceived; "the suspect is in custody"; "a cat"
00002137 03 n 01 thing 0 000 | a separate object; "how many things are on the list?"; "the suspect is in custody"
""",
    "data.verb": """00002724 29 v 01 choke 0 002 | breathe with difficulty; "She choked with emotion when she spoke"
00003000 29 v 01 dial 0 000 | call; "dial 5551234 for help now"; "stay away from storms now"
""",
    "data.adj": "", "data.adv": "",
}


def test_wordnet_examples_become_sentences_once_each(tmp_path):
    for name, text in WORDNET.items():
        (tmp_path / name).write_text(text)
    assert wordnet_examples(tmp_path) == [
        ("wordnet", "The suspect is in custody."), ("wordnet", "How many things are on the list?"),
        ("wordnet", "She choked with emotion when she spoke."), ("wordnet", "Stay away from storms now.")]
    # the licence line, the two-word example and the one with a digit run give nothing


def test_english_monolingual_text_takes_wordnet_after_the_fortunes(tmp_path):
    corpus, en_dir, wordnet = tmp_path / "corpus", tmp_path / "en", tmp_path / "wordnet"
    for d in (corpus, en_dir, wordnet):
        d.mkdir()
    for name, text in WORDNET.items():
        (wordnet / name).write_text(text)
    (en_dir / "wisdom").write_text("A dream will always triumph over reality.\n%\nStay away from storms now.\n")
    (corpus / "test_general.en").write_text("How many things are on the list?\n")

    stats = build_monolingual(corpus, tmp_path / "cache", {"en": [en_dir]}, wordnet)
    assert (corpus / "mono.en").read_text().splitlines() == [
        "A dream will always triumph over reality.", "Stay away from storms now.",
        "The suspect is in custody.", "She choked with emotion when she spoke."]
    assert (corpus / "mono.en.source").read_text().splitlines() == ["wisdom", "wisdom", "wordnet", "wordnet"]
    assert stats == {"en": {"sentences": 5, "dropped_heldout": 1, "kept": 4, "wordnet_kept": 2}}


def test_backtranslated_pairs_put_the_model_output_on_the_source_side(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    real = ["the red cat sleeps .", "a big dog runs fast .", "open the file ."]
    (corpus / "mono.de").write_text("".join(s + "\n" for s in real))
    model = make_tiny_checkpoint(tmp_path / "model")
    meta = json.loads((model / "metadata.json").read_text())
    (model / "metadata.json").write_text(json.dumps({**meta, "source_lang": "de", "target_lang": "en"}))

    counts = backtranslate(corpus, model, beam_size=2, dtype="float32")
    assert counts == {"direction": "en-de", "monolingual": 3, "pairs": 3}
    en_file, de_file = backtranslated_files(corpus, "en-de")
    assert de_file.read_text().splitlines() == real  # the real text is the target of en-de
    synthetic = en_file.read_text().splitlines()
    assert len(synthetic) == 3 and all(synthetic)
    assert not list(corpus.glob("backtranslated.de-en.*"))


def test_a_run_reads_back_translated_pairs_of_its_own_direction_only(tmp_path):
    for ext, lines in (("en", ["Open the file."] * 4), ("de", ["Datei öffnen."] * 4), ("source", ["gettext"] * 4)):
        (tmp_path / f"train.{ext}").write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    en_file, de_file = backtranslated_files(tmp_path, "en-de")
    en_file.write_text("Synthetic English one.\nSynthetic English two.\n")
    de_file.write_text("Echtes Deutsch eins.\nEchtes Deutsch zwei.\n", encoding="utf-8")

    plain = train.load_training_corpus(tmp_path, -1, 1)
    assert plain.description["pairs_by_source"] == {"gettext": 4}
    with_bt = train.load_training_corpus(tmp_path, -1, 1, repeat={"backtranslated": 2}, back_translated=True)
    assert with_bt.description["pairs_by_source"] == {"backtranslated": 4, "gettext": 4}
    assert sorted(set(zip(with_bt.source, with_bt.target)))[-2:] == [
        ("Synthetic English one.", "Echtes Deutsch eins."), ("Synthetic English two.", "Echtes Deutsch zwei.")]
    # de-en would learn to write the synthetic English: its own files are asked for instead
    with pytest.raises(SystemExit, match="backtranslated.de-en.en"):
        train.load_training_corpus(tmp_path, -1, 1, direction="de-en", back_translated=True)
