"""The character n-gram language identifier (model/langid.py), on profiles built from a few lines
of made-up text (tests/conftest.py)."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from model.langid import LanguageIdentifier, Profile, build_profile, load_profiles, ngrams, save_profiles
from tests.conftest import ENGLISH, GERMAN

UNSEEN = [
    ("en", "My brother bought a new car because the old one was broken."),
    ("en", "When will the doctor be back in the office?"),
    ("en", "the weather"),
    ("de", "Mein Bruder hat ein neues Auto gekauft, weil das alte kaputt war."),
    ("de", "Wann ist die Ärztin wieder in der Praxis?"),
    ("de", "nicht schlecht"),
]


@pytest.fixture(scope="module")
def profiles() -> dict[str, Profile]:
    return {"en": build_profile(ENGLISH), "de": build_profile(GERMAN)}


def test_ngrams_are_lower_cased_letters_with_word_boundaries():
    assert ngrams("Hi, 42 Öl!") == ["h", "i", " h", "hi", "i ", " hi", "hi ",
                                    "ö", "l", " ö", "öl", "l ", " öl", "öl "]
    assert ngrams("12 + 3 = ...") == []


def test_profile_keeps_the_most_frequent_ngrams_and_is_deterministic():
    profile = build_profile(["ab", "ba"], top=4)
    assert list(profile.logprobs) == ["a", "b", " a", " ab"]  # the ten n-grams seen once: in string order
    assert profile.logprobs["a"] > profile.logprobs[" ab"] > profile.unseen
    assert profile.logprob("xyz") == profile.unseen
    assert build_profile(ENGLISH) == build_profile(list(ENGLISH))


def test_detects_unseen_sentences(profiles):
    identifier = LanguageIdentifier(profiles)
    for language, text in UNSEEN:
        guesses = identifier.detect(text)
        assert [code for code, _ in guesses][0] == language, (text, guesses)
        assert sum(confidence for _, confidence in guesses) == pytest.approx(100)
        assert guesses[0][1] > guesses[1][1]


def test_longer_text_earns_more_confidence(profiles):
    identifier = LanguageIdentifier(profiles)
    [(_, short), _] = identifier.detect("the car")
    [(_, long), _] = identifier.detect("the car was broken, so my brother bought a new one in the town")
    assert 50 < short < long


def test_text_without_letters_gets_no_answer(profiles):
    identifier = LanguageIdentifier(profiles)
    assert identifier.detect("") == [] and identifier.detect("3.14 + 2 = ?!") == []


def test_json_round_trip(profiles, tmp_path):
    path = tmp_path / "langid.json"
    save_profiles(profiles, path)
    assert load_profiles(path) == profiles
    data = json.loads(path.read_text())
    data["orders"] = [1, 2]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="n-gram orders"):
        load_profiles(path)


def test_cli_builds_profiles_and_measures_accuracy(tmp_path, capsys):
    for language, lines in (("en", ENGLISH), ("de", GERMAN)):
        (tmp_path / f"train.{language}").write_text("\n".join(lines) + "\n")
        (tmp_path / f"held.{language}").write_text("\n".join(t for code, t in UNSEEN if code == language) + "\n")
    out = tmp_path / "langid.json"
    main(["langid", "--data", str(tmp_path), "--langs", "en,de", "--out", str(out), "--test-sets", "held"])
    assert sorted(load_profiles(out)) == ["de", "en"]
    table = capsys.readouterr().out
    assert "| all | 6 | 100.0% | 2 | 100.0% |" in table
