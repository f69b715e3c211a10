"""Inline target-term annotations for training (Dinu et al., 2019, "Training Neural Machine
Translation to Apply Terminology Constraints").

A share of the training pairs get, right after a source term, the target term the reference
uses for it, in its dictionary form, between two tags (model/terms.py):

    source  "Save the file\\ue020 Datei\\ue021 before you close it."
    target  "Speichern Sie die Datei, bevor Sie sie schließen."

The terms come from the Ding dictionary's 1-3 word glosses: a gloss is used where its source
side is in the source (whole words, any case) and its target side is in the reference, as
written or inflected (`model.terms.term_used`), so the model learns to write the annotated term
where the source term goes, inflected as the sentence needs, and to take no other word from
the annotation. Pairs of fewer than 4 source words (dictionary entries, menu labels) are left
as they are.
"""

from __future__ import annotations

import random
import re

from model.terms import annotate, term_used

MIN_WORDS = 4  # shorter sources are left unannotated
_WORD = re.compile(r"\w[\w'-]*")


def gloss_index(glosses: list[tuple[str, str]]) -> dict[str, list[tuple[list[str], str, str]]]:
    """(source term, target term) glosses by the source term's first word, lower-cased:
    first word -> [(the source term's words, source term, target term)], longest first."""
    index: dict[str, list[tuple[list[str], str, str]]] = {}
    for source, target in glosses:
        words = [w.lower() for w in _WORD.findall(source)]
        if words:
            index.setdefault(words[0], []).append((words, source, target))
    for entries in index.values():
        entries.sort(key=lambda e: -len(e[0]))
    return index


def annotate_pair(source: str, target: str, index: dict, rng: random.Random, max_terms: int = 2) -> str | None:
    """The source with 1 to max_terms glossed terms annotated (chosen at random among those whose
    target term the reference uses, not overlapping), or None when no gloss fits."""
    matches = list(_WORD.finditer(source))
    if len(matches) < MIN_WORDS:
        return None
    words = [m.group().lower() for m in matches]
    found = []  # (start char, end char, target term)
    i = 0
    while i < len(words):
        for term_words, _, term in index.get(words[i], ()):
            n = len(term_words)
            if words[i:i + n] == term_words and term_used(target, term):
                found.append((matches[i].start(), matches[i + n - 1].end(), term))
                i += n - 1  # terms do not overlap: the longest at a position wins
                break
        i += 1
    if not found:
        return None
    chosen = sorted(rng.sample(found, min(len(found), rng.randint(1, max_terms))))
    pieces, pos = [], 0
    for start, end, term in chosen:
        pieces += [source[pos:start], annotate(source[start:end], term)]
        pos = end
    return "".join(pieces) + source[pos:]


def annotate_corpus(sources: list[str], targets: list[str], glosses: list[tuple[str, str]], share: float,
                    seed: int) -> tuple[list[str], int]:
    """The sources with each pair, with probability `share` (seeded), annotated where a gloss
    fits it; and how many were."""
    index, rng = gloss_index(glosses), random.Random(seed)
    out, annotated = list(sources), 0
    for i, (source, target) in enumerate(zip(sources, targets)):
        if rng.random() >= share:
            continue
        new = annotate_pair(source, target, index, rng)
        if new is not None:
            out[i], annotated = new, annotated + 1
    return out, annotated
