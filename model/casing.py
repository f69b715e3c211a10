"""Text written in capitals: read it in sentence case, write its translation in capitals.

A model trained on ordinary text has seen few sentences in capitals ("SAVE CHANGES", "WARNING:
THIS WILL DELETE ALL FILES!"): SentencePiece cuts them into rare pieces, and the shipped model
then copies words instead of translating them ("PLEASE ENTER JOUR PASSWORT."). The Translator
gives such a sentence to the model in sentence case ("Warning: this will delete all files!")
and writes the translation in capitals.

A single word in capitals is left alone: it is more often an acronym ("USB", "PDF", "IT") than a
shouted word. Protected spans are sentinels (model/protect.py, private-use characters, which have
no case) while this runs, so a placeholder keeps its case ("%(name)s", not "%(NAME)S").
"""

from __future__ import annotations

import re
from collections.abc import Callable

# a word of two or more letters (digits and underscores excluded)
_WORD = re.compile(r"[^\W\d_]{2,}")
# where a new sentence starts inside a text: after . ! ? (and closing quotes or brackets) and white space
_SENTENCE_START = re.compile(r"(^|[.!?][\"'”’»)\]]*\s+)(\W*)(\w)")
# English "I" and its contractions (I'm, I've, I'll, I'd), which stay capitals in any sentence
_ENGLISH_I = re.compile(r"(?<![\w'’])i(?=$|[^\w'’]|['’](?:m|ve|ll|d)\b)")


def is_shouting(text: str) -> bool:
    """Whether the text is written in capitals: two or more words of two or more letters, and no
    lower-case letter anywhere."""
    return len(_WORD.findall(text)) >= 2 and not any(c.islower() for c in text)


def sentence_case(text: str, language: str | None = None, pieces: Callable[[str], int] | None = None) -> str:
    """Lower case, with the first letter of each sentence a capital (and, in English, "I"). German
    capitalizes its nouns: with `pieces` (how many vocabulary pieces spell a word), a German word
    is capitalized where the vocabulary spells it in fewer pieces so ("passwort" is two pieces,
    "Passwort" one: the model has seen it capitalized)."""
    text = _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2) + m.group(3).upper(), text.lower())
    if language == "en":
        return _ENGLISH_I.sub("I", text)
    if language == "de" and pieces is not None:
        return _WORD.sub(lambda m: _noun_case(m.group(), pieces), text)
    return text


def _noun_case(word: str, pieces: Callable[[str], int]) -> str:
    capitalized = word[0].upper() + word[1:]
    return capitalized if word.islower() and pieces(capitalized) < pieces(word) else word


def shout(text: str) -> str:
    """The text in capitals (German ß becomes SS, as str.upper() writes it)."""
    return text.upper()
