"""Protected spans: placeholders, inline markup, URLs, e-mail addresses and Weblate's masks
pass through the model as reserved sentinel pieces and come back exactly as written.

    masked = mask("Click <b>%s</b> to print.")
    masked.text   # "Click \\ue000\\ue001\\ue002 to print."   (sentinel k = chr(0xE000 + k))
    masked.spans  # ["<b>", "%s", "</b>"]
    unmask(translated_text, masked.spans)

The sentinels are Unicode private-use characters, one SentencePiece user-defined symbol each,
so a span is one token whatever its text, and the model learns to copy it, not to spell it.
Training uses the same `spans` to keep only pairs whose two sides hold the same spans, and
numbers them in a random order (`mask_pair`) so that every sentinel is seen, not just the first
few; at inference they are numbered left to right.

`repair` fixes what the model got wrong: a sentinel it dropped goes back where the
cross-attention points, before the target word whose first token's attention row weighs the
sentinel's source position most; a repeated one is kept once (where the attention is highest); one that
is not in the source is removed.
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from model.terms import Match, Terminology, annotate, term_used

SENTINEL_BASE = 0xE000  # Unicode private use area: never in ordinary text
MAX_SPANS = 32  # sentinels in the vocabulary; spans past the 32nd of a text stay plain text


def sentinel(k: int) -> str:
    return chr(SENTINEL_BASE + k)


def sentinel_index(piece: str) -> int | None:
    """k for a piece that is sentinel k (SentencePiece may prefix it with "▁"), else None."""
    p = piece[1:] if piece.startswith("▁") else piece
    if len(p) == 1 and 0 <= ord(p) - SENTINEL_BASE < MAX_SPANS:
        return ord(p) - SENTINEL_BASE
    return None


SENTINELS = [sentinel(k) for k in range(MAX_SPANS)]

# Alternatives in priority order: a tag wins over a placeholder inside it (<a href="%s">). Every
# repetition is possessive and every pattern starts at a fixed character or, for an e-mail address,
# only where its local part starts: a failed try costs the length it read once, so finding spans is
# linear in the text however it is made ("a" * 30000, "%" + "0" * n).
_TAG = r"</?[A-Za-z][\w:.-]*+(?:\s[^<>]*+)?+/?>"
_URL = r"(?:https?|ftp)://[^\s<>\"']++|www\.[\w-]++\.[^\s<>\"']++"
_EMAIL = r"(?<![\w.+-])[\w.+-]++@[\w-]++(?:\.[\w-]++)++"
_WEBLATE = r"\[X\d++X\]"  # Weblate masks placeholders as [X12X] before it asks a server
_ENTITY = r"&(?:#\d++|#x[0-9A-Fa-f]++|[A-Za-z]\w*+);"
_PLACEHOLDER = (
    r"%[A-Z][A-Z0-9_]++%?"                                      # %PRODUCTNAME, %OBJECT_NAME%
    r"|%L\d++"                                                  # Qt localized %L1
    r"|%(?:\d++\$)?(?:\([\w.-]++\))?[-+#0]*+(?:\d++|\*)?(?:\.(?:\d++|\*))?"
    r"(?:hh|h|ll|l|L|q|j|z|t|I64|I32|I)?[A-Za-z]"               # printf %s %-5.2f %1$s, Python %(name)s
    r"|%\d++|%[<>]"                                             # Qt %1; gcc's %< %> quotes
    r"|\{\{\w++\}\}|\{\w*+(?::[^{}\s]*+)?\}"                   # {{name}} {0} {name} {0:d}
    r"|\$\{\w++\}|\$\(\w++\)|\$[A-Za-z_]\w*+|\$\d++"          # ${VAR} $(ARG) $VAR $1
)
_SENTINEL = "[\ue000-\ue021]"  # a sentinel or term tag (model/terms.py) in the input is protected as itself
SPAN_RE = re.compile("|".join(f"(?:{p})" for p in (_SENTINEL, _TAG, _URL, _EMAIL, _WEBLATE, _ENTITY,
                                                  _PLACEHOLDER)))
_URL_TRAILING = ".,;:!?)]}'\""
_SENTINEL_SPLIT = re.compile(f"({_SENTINEL})")


def find_spans(text: str, foreign: Callable[[str], bool] | None = None) -> list[tuple[int, int]]:
    """(start, end) of every protected span, left to right. `%%` is a literal percent sign.
    With `foreign` (whether the model's vocabulary cannot spell a character), also every word
    holding such characters (foreign_words)."""
    found = _pattern_spans(text)
    if foreign is None:
        return found
    out, pos = [], 0
    for a, b in found + [(len(text), len(text))]:
        out += [(pos + x, pos + y) for x, y in foreign_words(text[pos:a], foreign)]
        out.append((a, b))
        pos = b
    return out[:-1]


def foreign_words(text: str, foreign: Callable[[str], bool]) -> list[tuple[int, int]]:
    """(start, end) of each run of characters the vocabulary cannot spell (emoji, other scripts,
    symbols such as € or ©), widened to the whole word when it touches letters ("Café",
    "Москва", "Dvořák"). The model would have to write such text byte by byte, which it does
    badly; as a span it is copied as written. ASCII is never foreign: punctuation a vocabulary
    lacks stays part of the sentence."""
    if text.isascii():  # most text: no character to look up
        return []

    def outside(c: str) -> bool:
        return ord(c) > 127 and foreign(c)

    out, i = [], 0
    while i < len(text):
        if not outside(text[i]):
            i += 1
            continue
        start, end = i, i + 1
        while end < len(text) and (outside(text[end]) or _in_word(text[end])):
            end += 1
        while start > 0 and _in_word(text[start - 1]):
            start -= 1
        out.append((start, end))
        i = end
    return out


def _in_word(c: str) -> bool:
    return c.isalpha() or unicodedata.category(c).startswith("M")


def _pattern_spans(text: str) -> list[tuple[int, int]]:
    out = []
    pos = 0
    while True:
        m = SPAN_RE.search(text, pos)
        if m is None:
            return out
        start, end = m.span()
        if start > 0 and text[start] == "%" and _escaped_percent(text, start):
            pos = start + 1
            continue
        if re.match(_URL, text[start:end]):  # a URL ends before trailing punctuation
            while end > start and text[end - 1] in _URL_TRAILING:
                end -= 1
        out.append((start, end))
        pos = end


def _escaped_percent(text: str, i: int) -> bool:
    """Whether the % at i is the second half of an odd run of %, i.e. escaped by `%%`."""
    run = 0
    while i - run - 1 >= 0 and text[i - run - 1] == "%":
        run += 1
    return run % 2 == 1


def spans(text: str, foreign: Callable[[str], bool] | None = None) -> list[str]:
    return [text[a:b] for a, b in find_spans(text, foreign)]


@dataclass(frozen=True)
class Annotation:
    """A glossary term left in the text with its target term inline (model/terms.py)."""

    entry: str  # the glossary's source term, as given
    written: str  # the source term as the text writes it
    target: str

    @property
    def text(self) -> str:
        return annotate(self.written, self.target)


@dataclass
class Masked:
    text: str  # the text with sentinel k in place of span k
    spans: list[str] = field(default_factory=list)  # span k as written (a glossary term: its target term)
    terms: dict[int, str] = field(default_factory=dict)  # sentinel k -> the terminology entry it stands for
    taken_out: Stripped | None = None  # a model without sentinels: the spans taken out instead (take_out)
    annotations: list[Annotation] = field(default_factory=list)  # glossary terms written inline (annotate_glossary)

    def terms_used(self, translation: str) -> set[str]:
        """The entries a translation holds: every sentinel's (the repair puts each one in) and the
        annotated ones whose target term it writes (terms.term_used)."""
        return set(self.terms.values()) | {a.entry for a in self.annotations if term_used(translation, a.target)}


def mask(text: str, order: list[int] | None = None, first: int = 0,
         foreign: Callable[[str], bool] | None = None, terms: Terminology | None = None,
         annotate_glossary: bool = False) -> Masked:
    """Replace the spans with sentinels first, first + 1, ... (or `order`'s numbers); spans past
    sentinel MAX_SPANS - 1 stay as they are. `foreign`: as in find_spans. `terms`: glossary and
    do-not-translate terms outside the other spans are spans too (model/terms.py), or with
    `annotate_glossary` a glossary term stays in the text with its target term inline
    (terms.annotate), for a model trained to read that."""
    found = [Match(a, b, text[a:b], "") for a, b in find_spans(text, foreign)]
    if terms:
        found = _with_terms(found, terms.find(text))
    inline = [m for m in found if annotate_glossary and m.glossary]
    found = [m for m in found if not (annotate_glossary and m.glossary)][:max(0, MAX_SPANS - first)]
    numbers = order if order is not None else list(range(first, first + len(found)))
    pieces, spans_by_number, pos = [], [""] * (max(numbers, default=-1) + 1), 0
    entries, annotations = {}, []
    for m, k in sorted([*zip(found, numbers), *((m, None) for m in inline)], key=lambda pair: pair[0].start):
        if k is None:
            annotation = Annotation(m.entry, text[m.start:m.end], m.output)
            pieces += [text[pos:m.start], annotation.text]
            annotations.append(annotation)
        else:
            pieces += [text[pos:m.start], sentinel(k)]
            spans_by_number[k] = m.output
            if m.entry:
                entries[k] = m.entry
        pos = m.end
    pieces.append(text[pos:])
    return Masked("".join(pieces), spans_by_number, entries, annotations=annotations)


def annotations_as_sentinels(text: str, annotations: list[Annotation], spans: list[str], terms: dict[int, str]) -> str:
    """A masked text with each inline annotation it holds made a new sentinel, numbered after
    `spans`, whose span is the target term (appended to `spans`, its entry to `terms`): the same
    text as mask() without annotate_glossary would have given, for a second try where the model
    missed an annotated term. An annotation past the last sentinel stays inline."""
    for a in annotations:
        while a.text in text and len(spans) < MAX_SPANS:
            terms[len(spans)] = a.entry
            text = text.replace(a.text, sentinel(len(spans)), 1)
            spans.append(a.target)
    return text


def _with_terms(spans: list[Match], terms: list[Match]) -> list[Match]:
    """The spans, and the term matches that overlap none of them, in text order."""
    free, i = [], 0
    for t in terms:  # both in text order, neither overlapping itself
        while i < len(spans) and spans[i].end <= t.start:
            i += 1
        if i == len(spans) or spans[i].start >= t.end:
            free.append(t)
    return sorted(spans + free, key=lambda m: m.start)


def unmask(text: str, spans: list[str]) -> str:
    """Put span k back for sentinel k (a sentinel with no span is removed). Where a neighbouring
    character would run into a span and change it ("%PRODUCTNAME" + "Einstellung" reads as the
    placeholder %PRODUCTNAMEEinstellung, "%" + "%s" as an escaped percent), a space goes between."""
    parts = _SENTINEL_SPLIT.split(text)  # text, sentinel, text, ..., text
    if len(parts) == 1:
        return text
    pieces = []  # (text, whether it is a span), empty texts and spanless sentinels left out
    for i, part in enumerate(parts):
        k = ord(part) - SENTINEL_BASE if i % 2 else -1
        if k < 0 and part:
            pieces.append((part, False))
        elif 0 <= k < len(spans) and spans[k]:
            pieces.append((spans[k], True))
    out: list[str] = []
    for i, (piece, is_span) in enumerate(pieces):
        if is_span and _pattern_spans(piece) == [(0, len(piece))]:  # not a foreign word: those inflect
            before = out[-1][-1:] if out else ""
            after = pieces[i + 1][0][:1] if i + 1 < len(pieces) else ""
            if before and (1, 1 + len(piece)) not in _pattern_spans(before + piece):
                out.append(" ")
            if after and (0, len(piece)) not in _pattern_spans(piece + after):
                piece += " "
        out.append(piece)
    return "".join(out)


_SPAN_SENTINEL = re.compile(f"[{SENTINELS[0]}-{SENTINELS[-1]}]")
_WORD_CHAR = re.compile(r"\w")


def keep_glue(translation: str, source: str) -> str:
    """A masked translation without the space the model put between a sentinel and a word where
    the masked source has that span glued to a word on that side: "\\ue000Datei\\ue001" (<b>Datei</b>)
    translated "\\ue000 File\\ue001" becomes "\\ue000File\\ue001"."""
    for m in _SPAN_SENTINEL.finditer(source):
        s, at = m.group(), m.start()
        if _WORD_CHAR.match(source[at + 1:at + 2]):
            translation = re.sub(f"{s} (?=\\w)", s, translation)
        if _WORD_CHAR.match(source[at - 1:at] if at else ""):
            translation = re.sub(f"(?<=\\w) {s}", s, translation)
    return translation


def mask_pair(source: str, target: str, rng: random.Random | None = None) -> tuple[str, str] | None:
    """Mask a training pair whose sides hold the same spans; None when they differ.

    The k-th occurrence of a span string in the target gets the sentinel of its k-th occurrence
    in the source. With `rng`, sentinels are numbered in a random order, so the model learns to
    copy every one of them rather than to expect 0 first.
    """
    src_found, tgt_found = find_spans(source), find_spans(target)
    src_spans = [source[a:b] for a, b in src_found]
    if Counter(src_spans) != Counter(target[a:b] for a, b in tgt_found) or len(src_spans) > MAX_SPANS:
        return None
    if not src_spans:
        return source, target
    numbers = rng.sample(range(MAX_SPANS), len(src_spans)) if rng else list(range(len(src_spans)))
    queue: dict[str, list[int]] = {}
    for s, k in zip(src_spans, numbers):
        queue.setdefault(s, []).append(k)
    target_numbers = [queue[target[a:b]].pop(0) for a, b in tgt_found]
    return mask(source, numbers).text, mask(target, target_numbers).text


@dataclass
class Repair:
    pieces: list[str]  # target pieces after the repair
    inserted: list[int] = field(default_factory=list)  # sentinels put back
    removed: list[int] = field(default_factory=list)  # sentinels dropped (repeats, unknown)
    rows: list[int | None] = field(default_factory=list)  # per piece: the model step that wrote it; None: inserted

    @property
    def changed(self) -> bool:
        return bool(self.inserted or self.removed)

    def weights_of_pieces(self, weights: np.ndarray) -> np.ndarray:
        """The model's attention weights (T', S) as rows of the repaired pieces (len(pieces), S);
        a piece the repair inserted has a row of zeros."""
        out = np.zeros((len(self.pieces), weights.shape[1]), dtype=weights.dtype)
        for i, t in enumerate(self.rows):
            if t is not None and t < weights.shape[0]:
                out[i] = weights[t]
        return out


def repair(source_pieces: list[str], target_pieces: list[str], weights: np.ndarray | None) -> Repair:
    """Make the target hold each sentinel of the source exactly once.

    weights: (T', S) cross-attention of the hypothesis, its mean over layers and heads, float32
    (T' >= len(target) rows: row t is the step that emitted target piece t), or None (then a
    missing sentinel goes at the end). source_pieces: the S source pieces, EOS included.
    """
    source_pos: dict[int, int] = {}
    for s, p in enumerate(source_pieces):
        k = sentinel_index(p)
        if k is not None:
            source_pos.setdefault(k, s)
    spaced = {k: source_pieces[s].startswith("▁") or (s > 0 and source_pieces[s - 1] == "▁")
              for k, s in source_pos.items()}

    def weight(t: int, k: int) -> float:
        if weights is None or t >= weights.shape[0]:
            return 0.0
        return float(weights[t, source_pos[k]])

    occurrences: dict[int, list[int]] = {}
    for t, p in enumerate(target_pieces):
        k = sentinel_index(p)
        if k is not None:
            occurrences.setdefault(k, []).append(t)
    # keep each sentinel once, where its attention weight is highest; drop those not in the source
    drop = set()
    result = Repair(pieces=[])
    for k, ts in occurrences.items():
        extra = ts if k not in source_pos else [t for t in ts if t != max(ts, key=lambda t: weight(t, k))]
        drop.update(extra)
        result.removed += [k] * len(extra)
    # a missing sentinel goes before the word whose first piece's step attended to it most (only
    # before a word: inside one it would split it, and a span glued to letters reads as another)
    free = [t for t in range(len(target_pieces)) if t not in drop and target_pieces[t].startswith("▁")
            and sentinel_index(target_pieces[t]) is None]
    inserts: dict[int, list[int]] = {}
    for k in sorted(source_pos, key=source_pos.get):
        if k in occurrences:
            continue
        at = len(target_pieces) if weights is None else max(free + [len(target_pieces)], key=lambda t: weight(t, k))
        inserts.setdefault(at, []).append(k)
        result.inserted.append(k)
    for t in range(len(target_pieces) + 1):
        for k in inserts.get(t, []):
            added = ["▁", sentinel(k)] if spaced[k] else [sentinel(k)]
            result.pieces += added
            result.rows += [None] * len(added)
        if t < len(target_pieces) and t not in drop:
            result.pieces.append(target_pieces[t])
            result.rows.append(t)
    return result


# --- models without sentinel pieces: spans taken out, put back where the attention points ----------

@dataclass
class Stripped:
    """A text for a model without sentinel pieces (an imported one): its spans taken out, with
    where each stood, to be put back into the translation where the cross-attention points
    (`place`; Bergamot places HTML tags so)."""

    text: str  # the text without its spans
    spans: list[str] = field(default_factory=list)  # as written
    at: list[int] = field(default_factory=list)  # per span: the offset in `text` where it stood
    glued: list[tuple[bool, bool]] = field(default_factory=list)  # per span: touching the word before / after
    terms: dict[int, str] = field(default_factory=dict)  # span k -> the terminology entry it stands for


def take_out(text: str, foreign: Callable[[str], bool] | None = None,
             terms: Terminology | None = None) -> Stripped:
    """The text without its spans (a space left where two spaces would meet); `terms`: glossary
    and do-not-translate terms are taken out too, a glossary term to come back as its target term."""
    found = [Match(a, b, text[a:b], "") for a, b in find_spans(text, foreign)]
    if terms:
        found = _with_terms(found, terms.find(text))
    out, spans, at, glued, pos, entries = [], [], [], [], 0, {}
    kept_length, kept_last = 0, ""  # characters in out, and the last of them
    for m in found:
        a, b = m.start, m.end
        if m.entry:
            entries[len(spans)] = m.entry
        out.append(text[pos:a])
        if a > pos:
            kept_length, kept_last = kept_length + a - pos, text[a - 1]
        # touching a word ("<b>Print", "Print</b>"); punctuation beside a span ("(%2)") may not
        # be beside it in the translation, so it does not count
        before_glued = a > 0 and text[a - 1].isalnum()
        after_glued = b < len(text) and text[b].isalnum()
        spans.append(m.output)
        at.append(kept_length)
        glued.append((before_glued, after_glued))
        pos = b
        if kept_last == " " and text[b:b + 1] == " ":  # "Open %s now" -> "Open now", not "Open  now"
            pos += 1
    out.append(text[pos:])
    return Stripped("".join(out), spans, at, glued, entries)


def piece_starts(pieces: list[str]) -> list[int]:
    """Each SentencePiece piece's offset in the text it spells ("▁" a space, the first one the
    dummy prefix; </s> at the end; a byte piece counted as one character)."""
    starts, length = [], 0
    for piece in pieces:
        if piece == "</s>":
            starts.append(max(length - 1, 0))
            continue
        starts.append(max(length - 1 + (1 if piece.startswith("\u2581") else 0), 0))
        length += 1 if piece.startswith("<0x") else len(piece)
    return starts


def place(stripped: Stripped, source_starts: list[int], target_pieces: list[str], weights: np.ndarray,
          decode: Callable[[list[str]], str]) -> str:
    """The translation (its pieces) with each span of the source put back before the target piece
    that attends most to the source piece at the span's position; a span that ended the source
    ends the translation. source_starts: each source piece's offset in stripped.text (EOS last,
    at len(text)); weights: (target rows, source pieces) attention, e.g. the mean over layers and
    heads; decode: pieces -> text."""
    before: dict[int, list[int]] = {}  # target piece index (len: the end) -> spans put before it
    for k, offset in enumerate(stripped.at):
        column = next((j for j, start in enumerate(source_starts) if start >= offset), len(source_starts) - 1)
        at_end = offset >= len(stripped.text.rstrip()) or not target_pieces or weights.shape[0] == 0
        row = len(target_pieces) if at_end else int(weights[: len(target_pieces), column].argmax())
        before.setdefault(row, []).append(k)
    text, start, glue = "", 0, False  # glue: what was written last takes the next piece without a space
    apart = False  # the span written last stood apart from the word after it
    for row in sorted(before) + [None]:
        end = len(target_pieces) if row is None else row
        if end > start:
            chunk = decode(target_pieces[start:end])
            spaced = text and not text.endswith(" ") and not glue and (
                target_pieces[start].startswith("\u2581") or apart and chunk[:1].isalnum())
            text += (" " if spaced else "") + chunk
            apart = False
        start = end
        if row is None:
            break
        for k in before[row]:
            glued_before, glued_after = stripped.glued[k]
            if text and not text.endswith(" ") and not glued_before:
                text += " "  # spaced from the word before, as in the source
            text += stripped.spans[k]
            glue = glued_after  # "<b>Drucken": the next word follows without its space
            apart = not glued_after  # "https://x.org jetzt", never "https://x.orgjetzt"
    return text
