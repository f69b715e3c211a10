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
from collections import Counter

from model.terms import annotate, term_used

MIN_WORDS = 4  # shorter sources are left unannotated
MAX_TERM_WORDS = 3  # the longest glosses used
_WORD = re.compile(r"\w[\w'-]*")


def noun_glosses(glosses: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (English, German) glosses whose German side is a noun (capitalised): the terms glossaries
    hold, rather than function words ("already" -> "schon") that would annotate every sentence."""
    return [(en, de) for en, de in glosses if de[:1].isupper()]


def gloss_index(glosses: list[tuple[str, str]]) -> dict[tuple[str, ...], list[tuple[str, str]]]:
    """(source term, target term) glosses by the source term's words, lower-cased."""
    index: dict[tuple[str, ...], list[tuple[str, str]]] = {}
    for source, target in glosses:
        words = tuple(w.lower() for w in _WORD.findall(source))
        if 1 <= len(words) <= MAX_TERM_WORDS:
            index.setdefault(words, []).append((source, target))
    return index


def fitting_terms(source: str, target: str, index: dict) -> list[tuple[int, int, str, str]]:
    """The glosses that fit a pair, left to right, not overlapping (the longest at a position):
    (start, end) of the source term in the source, the source term as the gloss writes it, and
    the target term, which the reference uses as written or inflected. [] for a source of fewer
    than MIN_WORDS words."""
    matches = list(_WORD.finditer(source))
    if len(matches) < MIN_WORDS:
        return []
    words = [m.group().lower() for m in matches]
    found = []
    i = 0
    while i < len(words):
        for n in range(min(MAX_TERM_WORDS, len(words) - i), 0, -1):
            fit = next(((source_term, term) for source_term, term in index.get(tuple(words[i:i + n]), ())
                        if term_used(target, term)), None)
            if fit:
                found.append((matches[i].start(), matches[i + n - 1].end(), *fit))
                i += n - 1
                break
        i += 1
    return found


def annotate_pair(source: str, fits: list[tuple[int, int, str, str]], rng: random.Random,
                  max_terms: int = 2) -> str:
    """The source with 1 to max_terms of its fitting glosses (fitting_terms) annotated, chosen at random."""
    chosen = sorted(rng.sample(fits, min(len(fits), rng.randint(1, max_terms))))
    pieces, pos = [], 0
    for start, end, _, term in chosen:
        pieces += [source[pos:start], annotate(source[start:end], term)]
        pos = end
    return "".join(pieces) + source[pos:]


def swap_term(source: str, target: str, fit: tuple[int, int, str, str], other: str) -> tuple[str, str] | None:
    """The pair with the fitting gloss's target term, where the reference writes it exactly as
    a word, replaced by another gloss of the same source term, annotated; None where it is not
    written exactly (an inflected form stays: its ending would not fit the other word)."""
    start, end, _, term = fit
    found = re.search(rf"(?<!\w){re.escape(term)}(?!\w)", target)
    if found is None:
        return None
    return (source[:start] + annotate(source[start:end], other) + source[end:],
            target[:found.start()] + other + target[found.end():])


def annotate_corpus(sources: list[str], targets: list[str], glosses: list[tuple[str, str]], share: float,
                    seed: int, usual_share: float = 0.3, swap_share: float = 0.3,
                    ) -> tuple[list[str], list[str], dict[str, int]]:
    """The pairs with each, with probability `share` (seeded), annotated where glosses fit it.

    An annotation that names the word the model would write anyway teaches it little, so the
    glosses are weighed by what the corpus does: for each source term, its usual translation is
    the gloss that fits most often. A pair with a gloss other than the usual one (a "folder" the
    reference calls "Verzeichnis", where most say "Ordner") has those annotated. Such pairs are
    few, so a pair whose glosses are all usual ones gets, with probability `swap_share`, another
    gloss of the term in the annotation and in the reference ("Ordner" -> "Mappe": the sentence
    around it may no longer agree with it, the price of the signal; swap_term), and else, with
    probability `usual_share`, its usual one annotated, so that an annotation is not a sign that
    the word changes. Returns the sources, the targets and counts."""
    index, rng = gloss_index(glosses), random.Random(seed)
    fits = [fitting_terms(source, target, index) for source, target in zip(sources, targets)]
    uses = Counter((source_term.lower(), term) for found in fits for _, _, source_term, term in found)
    usual: dict[str, tuple[int, str]] = {}
    for (source_term, term), n in uses.items():
        usual[source_term] = max(usual.get(source_term, (0, "")), (n, term))
    out, out_targets = list(sources), list(targets)
    counts = {"pairs_with_unusual_terms": 0, "pairs_with_swapped_terms": 0, "pairs_with_usual_terms": 0}
    for i, found in enumerate(fits):
        if not found or rng.random() >= share:
            continue
        unusual = [f for f in found if usual[f[2].lower()][1] != f[3]]
        if unusual:
            out[i] = annotate_pair(sources[i], unusual, rng)
            counts["pairs_with_unusual_terms"] += 1
            continue
        draw = rng.random()
        if draw < swap_share:
            fit = rng.choice(found)
            others = [t for _, t in index[tuple(w.lower() for w in _WORD.findall(fit[2]))] if t != fit[3]]
            swapped = swap_term(sources[i], targets[i], fit, rng.choice(others)) if others else None
            if swapped:
                out[i], out_targets[i] = swapped
                counts["pairs_with_swapped_terms"] += 1
                continue
        if draw < swap_share + usual_share:
            out[i] = annotate_pair(sources[i], found, rng)
            counts["pairs_with_usual_terms"] += 1
    return out, out_targets, counts
