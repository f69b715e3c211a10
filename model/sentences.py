"""Sentences: the model was trained on single sentences and has a token limit, so a paragraph is
translated sentence by sentence (the LibreTranslate routes, file translation, `nmt translate`).

`split_sentences` returns (between, sentences) with len(between) == len(sentences) + 1: the
sentences to translate, and what lies before, between and after them, kept as written;
`interleave` puts them back together, so interleave(*split_sentences(text)) == text. Text that has
no letter (numbers, punctuation, emoji, whitespace) is never a sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_OPENERS = "\"'“‘„«‹(["
_CLOSERS = "\"'”’»›)]"
_TERMINATORS = ".!?…"
_GAP = re.compile(r"\s+")
# Words that end with a period without ending the sentence (lower case, period left out). Words
# with an inner period (e.g., i.e., U.S.) and single letters (initials) are recognised by shape.
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "cf", "approx", "ca", "al",
                  "inc", "ltd", "co", "corp", "dept", "gen", "gov", "sen", "rep", "rev", "sgt", "lt", "col",
                  "capt", "mt", "ave", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct",
                  "nov", "dec"}
_NUMBER_ABBREVIATIONS = {"no", "nos", "nr", "art", "fig", "vol", "ch", "sec"}  # only before a number: "No. 5"


@dataclass(frozen=True)
class Splitting:
    """Where `split_sentences` cuts a text (DeepL's split_sentences: '1' both, 'nonewlines'
    punctuation only, '0' neither: the whole text is one sequence)."""

    punctuation: bool = True  # after . ! ? or ... before a capital (_ends_sentence)
    newlines: bool = True  # at every line break


def translatable(text: str) -> bool:
    return any(c.isalpha() for c in text)


def interleave(between: list[str], pieces: list[str]) -> str:
    assert len(between) == len(pieces) + 1, (len(between), len(pieces))
    return between[0] + "".join(piece + after for piece, after in zip(pieces, between[1:]))


# --- sentences --------------------------------------------------------------------------------
# Linear in the text: each gap is decided from the word before it and the character after it,
# never from the whole sentence so far (a text of one long sentence is client input).

def _ends_sentence(word: str, before: str, has_letter: bool, next_char: str) -> bool:
    """Whether a sentence whose last word is `word` (the word before it `before`; `has_letter`:
    the sentence holds a letter) ends when whitespace and `next_char` follow. Conservative: a
    missed split only makes one longer input."""
    core = word.rstrip(_CLOSERS)
    stem = core.rstrip(_TERMINATORS)
    if len(stem) == len(core) or not has_letter:  # "1. First item" is not a sentence of its own
        return False
    if not (next_char.isupper() or next_char.isdigit() or next_char in _OPENERS):
        return False
    if core[len(stem):] != ".":  # !, ?, …, ..., ?!
        return True
    word = (stem or before).lstrip(_OPENERS).lower()
    if (len(word) == 1 and word.isalpha()) or "." in word or word in _ABBREVIATIONS:
        return False
    return not (word in _NUMBER_ABBREVIATIONS and next_char.isdigit())


def split_sentences(text: str, splitting: Splitting = Splitting()) -> tuple[list[str], list[str]]:
    """(between, sentences): the sentences of `text`, without surrounding whitespace, and the
    whitespace between them. A sentence ends after . ! ? or … (and closing quotes or brackets)
    followed by whitespace and an upper-case letter, a digit or an opening quote, unless the word
    before the period is an abbreviation, an initial or a number's label ("No. 5"); a line break
    always ends one (`splitting` may turn either rule off). Pieces without a letter stay in
    `between`, untranslated."""
    between: list[list[str]] = [[]]  # each: the parts of one stretch between sentences
    sentences: list[str] = []

    def add(piece: str, space: str) -> None:
        if translatable(piece):
            sentences.append(piece)
            between.append([space])
        else:
            between[-1] += [piece, space]

    start, word_start, before, has_letter = 0, 0, "", False
    for gap in _GAP.finditer(text):
        if gap.start() == 0:
            between[0] = [gap.group()]
            start = word_start = gap.end()
            continue
        word = text[word_start:gap.start()]
        has_letter = has_letter or translatable(word)
        if gap.end() < len(text) and ((splitting.newlines and "\n" in gap.group()) or (
                splitting.punctuation and _ends_sentence(word, before, has_letter, text[gap.end()]))):
            add(text[start:gap.start()], gap.group())
            start, before, has_letter = gap.end(), "", False
        else:
            before = word
        word_start = gap.end()
    rest = text[start:]
    body = rest.rstrip()
    if body:
        add(body, rest[len(body):])
    else:
        between[-1].append(rest)
    return ["".join(parts) for parts in between], sentences
