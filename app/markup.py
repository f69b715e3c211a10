"""Split HTML and plain text into the pieces the model translates, and put translations back.

Every split returns (between, pieces) with len(between) == len(pieces) + 1: the pieces to
translate, and what lies before, between and after them, kept as written. `interleave` puts them
back together, so interleave(*split_sentences(text)) == text; `join_html` does the same for HTML,
escaping the (translated) text.

The model was trained on single sentences and has a token limit, so a paragraph is translated
sentence by sentence. Text that has no letter (numbers, punctuation, emoji, whitespace) is never
translated.
"""

from __future__ import annotations

import re
from html import escape, unescape
from html.parser import HTMLParser

# Their content is code or preformatted: never translated (nor anything inside them).
KEPT_ELEMENTS = {"script", "style", "code", "pre", "textarea"}
VOID_ELEMENTS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
                 "track", "wbr"}

_OPENERS = "\"'“‘„«‹(["
_CLOSERS = "\"'”’»›)]"
_TERMINATOR = re.compile(f"([.!?…]+)[{re.escape(_CLOSERS)}]*$")
# Words that end with a period without ending the sentence (lower case, period left out). Words
# with an inner period (e.g., i.e., U.S.) and single letters (initials) are recognised by shape.
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "cf", "approx", "ca", "al",
                  "inc", "ltd", "co", "corp", "dept", "gen", "gov", "sen", "rep", "rev", "sgt", "lt", "col",
                  "capt", "mt", "ave", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct",
                  "nov", "dec"}
_NUMBER_ABBREVIATIONS = {"no", "nos", "nr", "art", "fig", "vol", "ch", "sec"}  # only before a number: "No. 5"


def translatable(text: str) -> bool:
    return any(c.isalpha() for c in text)


def interleave(between: list[str], pieces: list[str]) -> str:
    assert len(between) == len(pieces) + 1, (len(between), len(pieces))
    return between[0] + "".join(piece + after for piece, after in zip(pieces, between[1:]))


# --- sentences --------------------------------------------------------------------------------

def _ends_sentence(sentence: str, next_char: str) -> bool:
    """Whether a sentence ends with `sentence` (no trailing whitespace) when whitespace and
    `next_char` follow. Conservative: a missed split only makes one longer input."""
    end = _TERMINATOR.search(sentence)
    if not end or not translatable(sentence):  # "1. First item" is not a sentence of its own
        return False
    if not (next_char.isupper() or next_char.isdigit() or next_char in _OPENERS):
        return False
    if end.group(1) != ".":  # !, ?, …, ..., ?!
        return True
    words = sentence[:end.start()].split()
    word = words[-1].lstrip(_OPENERS).lower() if words else ""
    if (len(word) == 1 and word.isalpha()) or "." in word or word in _ABBREVIATIONS:
        return False
    return not (word in _NUMBER_ABBREVIATIONS and next_char.isdigit())


def split_sentences(text: str) -> tuple[list[str], list[str]]:
    """(between, sentences): the sentences of `text`, without surrounding whitespace, and the
    whitespace between them. A sentence ends after . ! ? or … (and closing quotes or brackets)
    followed by whitespace and an upper-case letter, a digit or an opening quote, unless the word
    before the period is an abbreviation, an initial or a number's label ("No. 5"); a line break
    always ends one. Pieces without a letter stay in `between`, untranslated."""
    between, sentences = [""], []

    def add(piece: str, space: str) -> None:
        if translatable(piece):
            sentences.append(piece)
            between.append(space)
        else:
            between[-1] += piece + space

    start = 0
    for gap in re.finditer(r"\s+", text):
        if gap.start() == 0:
            between[0] = gap.group()
            start = gap.end()
        elif gap.end() < len(text) and ("\n" in gap.group() or
                                        _ends_sentence(text[start:gap.start()], text[gap.end()])):
            add(text[start:gap.start()], gap.group())
            start = gap.end()
    rest = text[start:]
    body = rest.rstrip()
    if body:
        add(body, rest[len(body):])
    else:
        between[-1] += rest
    return between, sentences


# --- HTML -------------------------------------------------------------------------------------

def _keeps_content(tag: str, attrs: list[tuple[str, str | None]]) -> bool:
    values = {name: (value or "") for name, value in attrs}
    return (tag in KEPT_ELEMENTS or values.get("translate", "").strip().lower() == "no"
            or "notranslate" in values.get("class", "").split())


class _Scanner(HTMLParser):
    """Where each part of a document starts, and for text: its decoded content and whether an
    enclosing element keeps it as written. Only the starts are recorded: a part runs until the
    next one starts, so whatever the parser skips (a stray '</>') stays in the document."""

    def __init__(self, document: str):
        super().__init__(convert_charrefs=True)
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", document)]
        self.parts: list[tuple[int, str | None]] = []  # (start, text to translate or None)
        self.open: list[tuple[str, bool]] = []  # open elements, and whether their content is kept
        self.feed(document)
        self.close()

    def _start(self) -> int:
        line, column = self.getpos()  # where the part being handled starts
        return self.line_starts[line - 1] + column

    def _markup(self) -> None:
        self.parts.append((self._start(), None))

    @property
    def _keeping(self) -> bool:
        return bool(self.open) and self.open[-1][1]

    def handle_starttag(self, tag, attrs):
        self._markup()
        if tag not in VOID_ELEMENTS:
            self.open.append((tag, self._keeping or _keeps_content(tag, attrs)))

    def handle_startendtag(self, tag, attrs):  # <br/>: nothing opens
        self._markup()

    def handle_endtag(self, tag):
        self._markup()
        names = [name for name, _ in self.open]
        if tag in names:  # a stray end tag closes nothing; an end tag closes what was left open inside
            del self.open[len(names) - 1 - names[::-1].index(tag):]

    def handle_data(self, data):
        self.parts.append((self._start(), None if self._keeping else data))

    def handle_comment(self, data):
        self._markup()

    def handle_decl(self, decl):
        self._markup()

    def handle_pi(self, data):
        self._markup()

    def unknown_decl(self, data):
        self._markup()


def _runs(document: str) -> list[tuple[str, str | None]]:
    """The document as (raw, text) parts: text is the decoded text of a run between tags, or None
    for markup and for text kept as written. Joining the raw parts gives back the document."""
    try:
        parts = _Scanner(document).parts
    except AssertionError:  # HTMLParser's answer to some malformed declarations, e.g. <![x[
        return [(document, None)]
    if not parts or parts[0][0] > 0:
        parts.insert(0, (0, None))
    runs: list[tuple[str, str | None]] = []
    ends = [start for start, _ in parts[1:]] + [len(document)]
    for (start, text), end in zip(parts, ends):
        raw = document[start:end]
        if text is not None and runs and runs[-1][1] is not None:  # text arrives in pieces ("a ", "<", " b")
            raw, text = runs[-1][0] + raw, runs[-1][1] + text
            runs.pop()
        runs.append((raw, text))
    return runs


def split_html(document: str) -> tuple[list[str], list[str]]:
    """(markup, texts): the text runs between tags to translate (entities decoded, surrounding
    whitespace left out) and the markup around them, as written: tags with their attributes,
    comments, doctype, and the text not to translate: that of script, style, code, pre and
    textarea, of elements with translate="no" or class "notranslate", and text without a letter."""
    markup, texts = [""], []
    for raw, text in _runs(document):
        # raw and text disagree when the parser dropped something inside the run: keep it all
        if text is None or not translatable(text) or unescape(raw) != text:
            markup[-1] += raw
            continue
        core = text.strip()
        lead = text[:len(text) - len(text.lstrip())]
        markup[-1] += lead
        texts.append(core)
        markup.append(text[len(lead) + len(core):])
    return markup, texts


def join_html(markup: list[str], texts: list[str]) -> str:
    return interleave(markup, [escape(text, quote=False) for text in texts])


def split_html_sentences(document: str) -> tuple[list[str], list[str]]:
    """split_html, then each text run split into sentences (for join_html)."""
    markup, runs = split_html(document)
    between, sentences = [markup[0]], []
    for run, after in zip(runs, markup[1:]):
        gaps, pieces = split_sentences(run)
        between[-1] += escape(gaps[0], quote=False)  # a gap may hold text without letters, "&" or "<"
        sentences += pieces
        between += [escape(gap, quote=False) for gap in gaps[1:]]
        between[-1] += after
    return between, sentences
