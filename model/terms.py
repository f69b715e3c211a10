"""Terminology: glossary entries (a source term and the target term the translation must use) and
do-not-translate terms (kept exactly as written), carried through the model as protected spans.

    terms = Terminology({"file": "Akte"}, ["Nextcloud"])
    masked = protect.mask("Open the file in Nextcloud.", terms=terms)
    masked.text    # "Open the \\ue000 in \\ue001."
    masked.spans   # ["Akte", "Nextcloud"]       what each sentinel becomes in the translation
    masked.terms   # {0: "file", 1: "Nextcloud"}  which entry each sentinel stands for

A do-not-translate term is a span like a placeholder: the model copies its sentinel and the term
comes back byte for byte. A glossary term's sentinel stands for the target term: the model
places it where the source term's translation goes, as it places a placeholder, and the target
term is written there as given (in its dictionary form: the model does not inflect it). With the
attention-guided repair (model/protect.py) every matched term is in the output exactly once. A
model without sentinel pieces (an imported one) reads the text with its terms taken out, and each
goes back where the cross-attention points (protect.take_out, place), as its placeholders do.

A model trained with inline term annotations (Dinu et al., 2019, "Training Neural Machine
Translation to Apply Terminology Constraints"; its vocabulary holds the two tags below) reads a
glossary term instead as the source term followed by the target term between the tags,

    "Open the file\\ue020 Akte\\ue021 in \\ue000."

and writes the target term itself, inflected where the sentence needs it ("die Akten").
Translator checks that each annotated term is in the translation (`term_used`); a text where
one is missing is translated again with the terms as sentinels, which cannot miss.

Matching: whole words, case-insensitively, the longest entry first where entries overlap; a
term inside a placeholder, tag or URL is not matched. Texts and terms are both client input, so
matching never builds a regular expression from terms: both are cut into units (a run of word
characters, or one other character with whether a word character stands on each side), and one
Aho-Corasick automaton over the terms' units finds, in time linear in the text, the longest term
that starts at each unit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_TERM_CHARS = 1024  # DeepL's limit for one glossary term (bytes of UTF-8 there; characters here)
# The tags around an inline target term: private-use characters right after the 32 sentinels
# (model/protect.py), one SentencePiece piece each in a vocabulary trained with annotations.
TERM_OPEN, TERM_CLOSE = "\ue020", "\ue021"
TERM_TAGS = (TERM_OPEN, TERM_CLOSE)
# Endings a word may take where a dictionary form becomes inflected (German and English); see term_used
INFLECTION_ENDINGS = ("en", "em", "er", "es", "e", "n", "s")
MAX_INFLECTION = 3  # letters an inflected word may have after the term word's stem ("-ern", "-en")


class TermError(ValueError):
    """A glossary or term list that cannot be used: says which entry and why."""


@dataclass(frozen=True)
class Match:
    start: int
    end: int
    output: str  # what the translation gets in the term's place
    entry: str  # the glossary's source term, or the do-not-translate term, as given
    glossary: bool = False  # a glossary entry (output: its target term), not a do-not-translate term


@dataclass
class Terminology:
    glossary: dict[str, str] = field(default_factory=dict)  # source term -> target term
    keep: list[str] = field(default_factory=list)  # do-not-translate terms

    def __post_init__(self):
        for source, target in self.glossary.items():
            check_term(source, "glossary source term")
            check_term(target, f"glossary target term of {source!r}")
        for term in self.keep:
            check_term(term, "do_not_translate term")
        entries = [(s, t, s) for s, t in self.glossary.items()] + [(k, None, k) for k in self.keep]
        entries.sort(key=lambda e: -len(e[0]))  # the longest wins where entries overlap
        self._by_units = {}  # a term's units -> (target term or None, entry); the first entry wins
        for source, target, entry in entries:
            self._by_units.setdefault(tuple(u for u, _, _ in _units(source)), (target, entry))
        self._automaton = _LongestFirst(list(self._by_units)) if entries else None

    def __bool__(self) -> bool:
        return bool(self.glossary or self.keep)

    @property
    def entries(self) -> list[str]:
        return list(self.glossary) + [k for k in self.keep if k not in self.glossary]

    def find(self, text: str) -> list[Match]:
        """Every occurrence of an entry in `text`, left to right, not overlapping."""
        if self._automaton is None:
            return []
        units = _units(text)
        longest = self._automaton.longest_at_each_start([u for u, _, _ in units])
        out, i = [], 0
        while i < len(units):
            if not longest[i]:
                i += 1
                continue
            j = i + longest[i]
            target, entry = self._by_units[tuple(u for u, _, _ in units[i:j])]
            start, end = units[i][1], units[j - 1][2]
            written = text[start:end]
            out.append(Match(start, end, written if target is None else target, entry, target is not None))
            i = j
        return out

    def merged(self, other: Terminology | None) -> Terminology:
        """This terminology with `other`'s entries added (other's glossary wins on a clash)."""
        if not other:
            return self
        return Terminology({**self.glossary, **other.glossary}, list(dict.fromkeys(self.keep + other.keep)))


_UNIT = re.compile(r"\w+|\W")


def _fold(text: str) -> str:
    """Lower case, one character for one (a character whose lower case is longer, like "İ", stays)."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


def _units(text: str) -> list[tuple[str, int, int]]:
    """(unit, start, end) for each unit of `text`: a run of word characters (folded), or one other
    character marked with whether a word character stands before and after it (the text's ends
    count as no word character), so that units equal only where the text around them allows a
    whole-word match."""
    folded, out = _fold(text), []
    for m in _UNIT.finditer(folded):
        unit, a, b = m.group(), m.start(), m.end()
        if _UNIT_WORD.match(unit) is None:
            before = a > 0 and _UNIT_WORD.match(folded, a - 1) is not None
            after = b < len(folded) and _UNIT_WORD.match(folded, b) is not None
            unit = f"{int(before)}{int(after)}{unit}"
        out.append((unit, a, b))
    return out


_UNIT_WORD = re.compile(r"\w")


class _LongestFirst:
    """Aho-Corasick over sequences of units, run backwards: for each start in a text, the length
    (in units) of the longest key that starts there. Linear in the text and in the keys' units."""

    def __init__(self, keys: list[tuple[str, ...]]):
        self.children: list[dict[str, int]] = [{}]
        depth, terminal = [0], [False]
        for key in keys:
            state = 0
            for unit in reversed(key):
                nxt = self.children[state].get(unit)
                if nxt is None:
                    nxt = self.children[state][unit] = len(self.children)
                    self.children.append({})
                    depth.append(depth[state] + 1)
                    terminal.append(False)
                state = nxt
            terminal[state] = True
        self.fail = [0] * len(self.children)
        self.best = [0] * len(self.children)  # the longest key that is a suffix of the state's units
        queue = list(self.children[0].values())
        for state in queue:
            self.best[state] = depth[state] if terminal[state] else 0
        for state in queue:  # breadth first: a state's fail link is shallower, so done before it
            for unit, child in self.children[state].items():
                f = self.fail[state]
                while f and unit not in self.children[f]:
                    f = self.fail[f]
                self.fail[child] = self.children[f].get(unit, 0)
                self.best[child] = depth[child] if terminal[child] else self.best[self.fail[child]]
                queue.append(child)

    def longest_at_each_start(self, units: list[str]) -> list[int]:
        longest, state = [0] * len(units), 0
        for i in range(len(units) - 1, -1, -1):
            unit = units[i]
            while state and unit not in self.children[state]:
                state = self.fail[state]
            state = self.children[state].get(unit, 0)
            longest[i] = self.best[state]
        return longest


def check_term(term: str, what: str) -> None:
    if not isinstance(term, str) or not term.strip():
        raise TermError(f"{what}: must be a non-empty string (got {term!r})")
    surrogate = next((i for i, c in enumerate(term) if 0xD800 <= ord(c) <= 0xDFFF), None)
    if surrogate is not None:  # first: the messages below quote the term, and an answer must be valid UTF-8
        raise TermError(f"{what} {term.encode('utf-8', 'backslashreplace').decode()!r}: holds a lone surrogate "
                        f"(U+{ord(term[surrogate]):04X}) at character {surrogate}, which is not valid Unicode")
    if term != term.strip():
        raise TermError(f"{what} {term!r}: leading or trailing whitespace")
    if len(term) > MAX_TERM_CHARS:
        raise TermError(f"{what} {term[:40]!r}...: {len(term)} characters; at most {MAX_TERM_CHARS}")
    if any(c in term for c in "\t\n\r") or any(0xE000 <= ord(c) <= ord(TERM_CLOSE) for c in term):
        raise TermError(f"{what} {term!r}: holds a tab, a line break or a reserved character")


def annotate(source_term: str, target_term: str) -> str:
    """A source term with its required target term inline, as annotated models read it."""
    return f"{source_term}{TERM_OPEN} {target_term}{TERM_CLOSE}"


def retry_beam_size(beam_size: int, n_best: int = 1) -> int:
    """The beam for translating again, with its terms as sentinels, a text whose annotated term
    no beam wrote: greedy (or n_best beams when more are asked), not the request's beam_size. A
    repair pass for about a quarter of the texts with a term; on the glossary set (`nmt
    eval-terms`) it costs 0.3 chrF against beam 4 (55.12 -> 54.82; without a glossary 48.73) and
    keeps a glossary's cost within 1.3x."""
    return min(beam_size, max(1, n_best))


def strip_tags(text: str) -> str:
    return text.replace(TERM_OPEN, "").replace(TERM_CLOSE, "")


def term_used(translation: str, term: str) -> bool:
    """Whether the translation holds the term, as written or inflected: each word of the term,
    without a common ending, starts a word of the translation followed by at most
    MAX_INFLECTION more letters, in order, case-insensitively ("Datei" in "Dateien", "neue" in
    "neuen", "Ordner" in "Ordners"; not "Akte" in "aktiviert")."""
    def stem(word: str) -> str:
        for ending in INFLECTION_ENDINGS:
            if word.endswith(ending) and len(word) - len(ending) >= 3:
                return word[:-len(ending)]
        return word

    found = [w.casefold() for w in re.findall(r"\w+", translation)]
    wanted = [stem(w.casefold()) for w in re.findall(r"\w+", term)]
    if not wanted:
        return term in translation
    return any(all(found[start + j].startswith(w) and len(found[start + j]) - len(w) <= MAX_INFLECTION
                   for j, w in enumerate(wanted))
               for start in range(len(found) - len(wanted) + 1))


def report(terms: Terminology, matched: set[str], used: set[str]) -> dict[str, list[str]]:
    """What became of each entry: `applied` (in the source, and its term in the translation),
    `not_applied` (in the source, but the model could not take it: more spans than sentinels),
    `not_found` (not in the source)."""
    return {"applied": [e for e in terms.entries if e in used],
            "not_applied": [e for e in terms.entries if e in matched and e not in used],
            "not_found": [e for e in terms.entries if e not in matched]}
