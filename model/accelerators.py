"""Accelerator marks in UI strings: `&File` (Qt, Windows), `_Open` (GTK), `~Save` (LibreOffice).

The model was trained on catalogs with these marks removed (training/corpus/common.py), so a mark in its
input is noise it copies or garbles (`&File` -> `& Datei`). The Translator gives it the string
without the mark and puts the mark back in the translation, before the first letter of the word
whose first piece attended most to the marked word (the cross-attention, as the repair of protected
spans uses it), so that `Save &As...` becomes `Speichern &unter...`.

Only a mark at the start of a word and before a letter counts, and only when the string has one:
`Q&A`, `R&&D`, `file_name`, `_italic_` and `&a &b` are left as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# a mark at the start of a word (not after a letter, digit or another mark), before a letter
_MARK = re.compile(r"(?<![\w&~])([&_~])(?=[^\W\d_])")


@dataclass
class Marked:
    text: str  # the string without its mark
    mark: str  # "&", "_" or "~"
    word: int  # the marked word's index among the text's words (split on white space)


def find(text: str) -> Marked | None:
    """The string without its accelerator mark, or None when it has none, or more than one."""
    found = list(_MARK.finditer(text))
    if len(found) != 1:
        return None
    m = found[0]
    rest_of_word = re.match(r"\S*", text[m.end():]).group()
    if m.group(1) in rest_of_word:  # "_italic_": emphasis, not a mark
        return None
    return Marked(text[:m.start()] + text[m.end():], m.group(1), len(text[:m.start()].split()))


def word_starts(pieces: list[str]) -> list[int]:
    """Indices of the pieces that start a word (SentencePiece's "▁"), the first piece always."""
    return [i for i, p in enumerate(pieces) if i == 0 or p.startswith("▁")]


def place(text: str, pieces: list[str], weights: np.ndarray | None, source_pieces: list[str],
          marked: Marked) -> str:
    """The translation `text` (decoded from target `pieces`) with the mark before the first letter of
    the target word whose first piece attends most to the marked source word's first piece.
    weights: (T', S), the cross-attention's mean over layers and heads, or None; without it, or
    when the pieces do not line up with the text's words, the mark goes on the first word that has a letter."""
    words = text.split(" ")
    target = word_starts(pieces)
    source = word_starts(source_pieces)
    choice = None
    if weights is not None and len(target) == len(words) and marked.word < len(source):
        column = source[marked.word]
        candidates = [k for k, t in enumerate(target) if t < weights.shape[0] and _letter(words[k]) is not None]
        if candidates:
            choice = max(candidates, key=lambda k: weights[target[k], column])
    if choice is None:
        choice = next((k for k, w in enumerate(words) if _letter(w) is not None), None)
    if choice is None:
        return text
    at = _letter(words[choice])
    words[choice] = words[choice][:at] + marked.mark + words[choice][at:]
    return " ".join(words)


def _letter(word: str) -> int | None:
    """Index of the word's first letter, or None."""
    return next((i for i, c in enumerate(word) if c.isalpha()), None)
