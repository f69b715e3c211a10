"""Split HTML and plain text into the pieces the model translates, and put translations back.

Every split returns (between, pieces) with len(between) == len(pieces) + 1: the pieces to
translate, and what lies before, between and after them, kept as written, as sentences do
(model/sentences.py); `join_html` puts HTML back together, escaping the (translated) text.

`split_document` is what the LibreTranslate route uses: with a model that has sentinels for
protected spans (model/protect.py), a document's placeholders, URLs and, in HTML, its inline tags
(`<b>`, `<a href>`, `<span>`, ...) become sentinels before it is split, so `Click <b>Print</b> to
print.` is one sentence to the model, and every tag comes back as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape, unescape
from html.parser import HTMLParser

from model import protect
from model.sentences import Splitting, interleave, split_sentences, translatable
from model.terms import Terminology, term_used

# Their content is code or preformatted: never translated (nor anything inside them).
KEPT_ELEMENTS = {"script", "style", "code", "pre", "textarea"}
VOID_ELEMENTS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
                 "track", "wbr"}
# Elements inside a sentence: with sentinels their tags travel through the model with the text.
# `x`: Weblate's stand-in for a placeholder when it asks a DeepL-compatible server (<x id="3"></x>).
INLINE_ELEMENTS = {"a", "abbr", "b", "bdi", "bdo", "cite", "data", "del", "dfn", "em", "font", "i", "ins", "mark",
                   "q", "s", "small", "span", "strong", "sub", "sup", "time", "u", "x"}

# Deepest nesting of open elements a document may have (NMT_MAX_HTML_DEPTH): each end tag looks
# through the open elements, so without a bound 20,000 nested <div>s cost seconds of CPU.
MAX_DEPTH = 512


class TooDeep(ValueError):
    """HTML nested deeper than allowed: the request gets a 400 (app/errors.py)."""

    def __init__(self, max_depth: int):
        super().__init__(f"the HTML nests elements more than {max_depth:,} deep (NMT_MAX_HTML_DEPTH): close "
                         "elements, or send it as text")


# --- HTML -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reading:
    """How a request asks its texts to be read, beside the defaults: where sentences end, and the
    elements whose content stays as written (DeepL's split_sentences and ignore_tags)."""

    splitting: Splitting = Splitting()
    kept_tags: frozenset[str] = frozenset()  # beside KEPT_ELEMENTS; lower case, as HTMLParser names tags


def _keeps_content(tag: str, attrs: list[tuple[str, str | None]], kept_tags: frozenset[str] = frozenset()) -> bool:
    values = {name: (value or "") for name, value in attrs}
    return (tag in KEPT_ELEMENTS or tag in kept_tags or values.get("translate", "").strip().lower() == "no"
            or "notranslate" in values.get("class", "").split())


_MARKUP_START = re.compile(r"<[A-Za-z/!?]")
_STAND_INS = "\ufdd0\ufdd1\ufdd2\ufdd3\ufdd4\ufdd5\ufdd6\ufdd7"  # noncharacters: never in real text


def _unclosed_tail_as_text(document: str) -> tuple[str | None, str]:
    """(stand-in, document): HTMLParser reads markup that starts after the document's last '>'
    as text, but only after it has looked for each such tag's end through the rest of the
    document: `'<a ' * 8000` costs it seconds, growing with the square of the length. That tail
    is given to it with each '<' replaced by a stand-in of the same length, which handle_data
    turns back: the same parts at the same offsets, in linear time. (None, document) when the
    tail holds no markup, or when every stand-in occurs in the document (then it is read as is)."""
    cut = document.rfind(">") + 1
    if not _MARKUP_START.search(document, cut):
        return None, document
    decoded = unescape(document)
    stand_in = next((c for c in _STAND_INS if c not in document and c not in decoded), None)
    if stand_in is None:
        return None, document
    return stand_in, document[:cut] + document[cut:].replace("<", stand_in)


class _Scanner(HTMLParser):
    """Where each part of a document starts, and for text: its decoded content and whether an
    enclosing element keeps it as written. Only the starts are recorded: a part runs until the
    next one starts, so whatever the parser skips (a stray '</>') stays in the document."""

    def __init__(self, document: str, max_depth: int = MAX_DEPTH, kept_tags: frozenset[str] = frozenset()):
        super().__init__(convert_charrefs=True)
        self.max_depth, self.kept_tags = max_depth, kept_tags
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", document)]
        self.parts: list[tuple[int, str | None]] = []  # (start, text to translate or None)
        self.inline: set[int] = set()  # starts of the tags of inline elements outside kept content
        self.open: list[tuple[str, bool]] = []  # open elements, and whether their content is kept
        self.stand_in, document = _unclosed_tail_as_text(document)
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
        if tag in INLINE_ELEMENTS and not self._keeping and not _keeps_content(tag, attrs, self.kept_tags):
            self.inline.add(self.parts[-1][0])
        if tag not in VOID_ELEMENTS:
            if len(self.open) >= self.max_depth:
                raise TooDeep(self.max_depth)
            self.open.append((tag, self._keeping or _keeps_content(tag, attrs, self.kept_tags)))

    def handle_startendtag(self, tag, attrs):  # <br/>: nothing opens
        self._markup()

    def handle_endtag(self, tag):
        self._markup()
        if tag in INLINE_ELEMENTS and not self._keeping:
            self.inline.add(self.parts[-1][0])
        names = [name for name, _ in self.open]
        if tag in names:  # a stray end tag closes nothing; an end tag closes what was left open inside
            del self.open[len(names) - 1 - names[::-1].index(tag):]

    def handle_data(self, data):
        if self.stand_in:
            data = data.replace(self.stand_in, "<")
        self.parts.append((self._start(), None if self._keeping else data))

    def handle_comment(self, data):
        self._markup()

    def handle_decl(self, decl):
        self._markup()

    def handle_pi(self, data):
        self._markup()

    def unknown_decl(self, data):
        self._markup()


def _runs(document: str, inline: set[int] | None = None, max_depth: int = MAX_DEPTH,
          kept_tags: frozenset[str] = frozenset()) -> list[tuple[str, str | None]]:
    """The document as (raw, text) parts: text is the decoded text of a run between tags, or None
    for markup and for text kept as written. Joining the raw parts gives back the document.
    With `inline` (a set), the indices of the runs that are inline tags are added to it."""
    try:
        scanner = _Scanner(document, max_depth, kept_tags)
    except AssertionError:  # HTMLParser's answer to some malformed declarations, e.g. <![x[
        return [(document, None)]
    parts = scanner.parts
    if not parts or parts[0][0] > 0:
        parts.insert(0, (0, None))
    runs: list[tuple[int, int, list[str] | None]] = []  # (start, end, text pieces or None)
    ends = [start for start, _ in parts[1:]] + [len(document)]
    for (start, text), end in zip(parts, ends):
        if text is not None and runs and runs[-1][2] is not None:  # text arrives in pieces ("a ", "<", " b")
            runs[-1][2].append(text)
            runs[-1] = (runs[-1][0], end, runs[-1][2])
            continue
        if inline is not None and start in scanner.inline:
            inline.add(len(runs))
        runs.append((start, end, None if text is None else [text]))
    return [(document[start:end], None if pieces is None else "".join(pieces)) for start, end, pieces in runs]


def split_html(document: str, max_depth: int = MAX_DEPTH, kept_tags: frozenset[str] = frozenset(),
               ) -> tuple[list[str], list[str]]:
    """(markup, texts): the text runs between tags to translate (entities decoded, surrounding
    whitespace left out) and the markup around them, as written: tags with their attributes,
    comments, doctype, and the text not to translate: that of script, style, code, pre and
    textarea, of elements with translate="no" or class "notranslate" or named in `kept_tags`, and
    text without a letter."""
    markup: list[list[str]] = [[]]  # the parts of each stretch of markup
    texts: list[str] = []
    for raw, text in _runs(document, max_depth=max_depth, kept_tags=kept_tags):
        # raw and text disagree when the parser dropped something inside the run: keep it all
        if text is None or not translatable(text) or unescape(raw) != text:
            markup[-1].append(raw)
            continue
        core = text.strip()
        lead = text[:len(text) - len(text.lstrip())]
        markup[-1].append(lead)
        texts.append(core)
        markup.append([text[len(lead) + len(core):]])
    return ["".join(parts) for parts in markup], texts


def join_html(markup: list[str], texts: list[str]) -> str:
    return interleave(markup, [escape(text, quote=False) for text in texts])


def split_html_sentences(document: str, max_depth: int = MAX_DEPTH, reading: Reading = Reading(),
                         ) -> tuple[list[str], list[str]]:
    """split_html, then each text run split into sentences (for join_html)."""
    markup, runs = split_html(document, max_depth, reading.kept_tags)
    between, sentences = [[markup[0]]], []  # between: the parts of each stretch
    for run, after in zip(runs, markup[1:]):
        gaps, pieces = split_sentences(run, reading.splitting)
        between[-1].append(escape(gaps[0], quote=False))  # a gap may hold text without letters, "&" or "<"
        sentences += pieces
        between += [[escape(gap, quote=False)] for gap in gaps[1:]]
        between[-1].append(after)
    return ["".join(parts) for parts in between], sentences


# --- documents with protected spans -------------------------------------------------------------

@dataclass
class Document:
    """A text or HTML document cut for the model: `sentences` (masked: sentinel k stands for
    spans[k]) and what lies `between` them, final (spans put back, HTML escaped)."""

    between: list[str]
    sentences: list[str]
    spans: list[str]
    html: bool
    terms: dict[int, str] = field(default_factory=dict)  # sentinel k -> the terminology entry it stands for
    placed_terms: set[str] = field(default_factory=set)  # a model without sentinels: entries put in by attention
    annotations: list[protect.Annotation] = field(default_factory=list)  # glossary terms written inline

    def missed_terms(self, sentence: int, translation: str) -> bool:
        """Whether a (masked) translation of sentence `sentence` lacks a target term annotated in it."""
        return any(a.text in self.sentences[sentence] and not term_used(translation, a.target)
                   for a in self.annotations)

    def annotations_as_sentinels(self, sentence: int) -> str:
        """Sentence `sentence` with its annotated terms made sentinels (protect.annotations_as_sentinels),
        for a second try: the document's spans and terms take the new ones."""
        before = len(self.spans)
        text = protect.annotations_as_sentinels(self.sentences[sentence], self.annotations, self.spans, self.terms)
        if self.html:  # spans of HTML are put back as written in HTML
            self.spans[before:] = [escape(span, quote=False) for span in self.spans[before:]]
        self.sentences[sentence] = text
        return text

    def terms_used(self, translation: str) -> set[str]:
        """The entries a translation of the document holds: sentinels' (the repair put every one
        in), attention-placed, and annotated target terms the model wrote."""
        return (set(self.terms.values()) | self.placed_terms
                | {a.entry for a in self.annotations if term_used(translation, a.target)})

    def versions(self, per_sentence: list[list[str]]) -> list[str]:
        """The document's best translation, then its alternatives, from each sentence's hypotheses:
        version k takes hypothesis k of every sentence (as many versions as its sentence with the
        fewest hypotheses has)."""
        count = min((len(hypotheses) for hypotheses in per_sentence), default=1)
        return [self.join([hypotheses[k] for hypotheses in per_sentence]) for k in range(count)]

    def join(self, translations: list[str]) -> str:
        """The document with each sentence replaced by its translation (masked like the sentence)."""
        texts = [escape(t, quote=False) if self.html else t for t in translations]
        return interleave(self.between, [protect.unmask(protect.keep_glue(t, s), self.spans)
                                         for t, s in zip(texts, self.sentences)])

    @property
    def text(self) -> str:
        """Its translatable text, spans put back (what language detection reads)."""
        return " ".join(protect.unmask(s, self.spans) for s in self.sentences)


def split_document(document: str, html: bool, spans: bool, foreign: Callable[[str], bool] | None = None,
                   max_depth: int = MAX_DEPTH, terms: Terminology | None = None, annotate: bool = False,
                   reading: Reading = Reading()) -> Document:
    """Sentences to translate and the rest; with `spans`, protected spans masked first (and, in
    HTML, inline tags too: a sentence runs across them); `foreign`: the characters the model's
    vocabulary cannot spell, whose words are spans too (protect.find_spans); `terms`: glossary
    and do-not-translate terms, spans too (model/terms.py), or with `annotate` glossary terms
    inline (a model that reads annotations); `reading`: where sentences end, and what else HTML
    keeps as written."""
    if not html:
        masked = protect.mask(document, foreign=foreign, terms=terms, annotate_glossary=annotate) if spans \
            else protect.Masked(document)
        gaps, sentences = split_sentences(masked.text, reading.splitting)
        return Document([protect.unmask(g, masked.spans) for g in gaps], sentences, masked.spans, False,
                        masked.terms, annotations=masked.annotations)
    if not spans:
        between, sentences = split_html_sentences(document, max_depth, reading)
        return Document(between, sentences, [], True)
    between: list[list[str]] = [[]]  # the parts of each stretch between sentences
    segments, all_spans, all_terms, annotations = [], [], {}, []
    for segment in _segments(document, max_depth, reading.kept_tags):
        if isinstance(segment, str):
            between[-1].append(segment)
            continue
        masked = _mask_segment(segment, len(all_spans), foreign, terms, annotate)
        all_spans += masked.spans[len(all_spans):]
        all_terms.update(masked.terms)
        annotations += masked.annotations
        core = masked.text.strip()
        lead, trail = masked.text[:len(masked.text) - len(masked.text.lstrip())], masked.text[len(masked.text.rstrip()):]
        gaps, sentences = split_sentences(core, reading.splitting)
        segments += sentences
        between[-1] += [lead, protect.unmask(escape(gaps[0], quote=False), all_spans)]
        between += [[protect.unmask(escape(g, quote=False), all_spans)] for g in gaps[1:]]
        between[-1].append(trail)
    return Document(["".join(parts) for parts in between], segments, all_spans, True, all_terms,
                    annotations=annotations)


def _segments(document: str, max_depth: int = MAX_DEPTH, kept_tags: frozenset[str] = frozenset(),
              ) -> list[str | list[tuple[str, str | None]]]:
    """The document as markup (str) and segments: runs of text and inline tags that read as one
    text, each a list of (raw, decoded text or None for a tag), with no tag at either end."""
    inline: set[int] = set()
    runs = _runs(document, inline, max_depth, kept_tags)
    out: list[str | list[tuple[str, str | None]]] = []
    current: list[tuple[str, str | None]] = []

    def flush():
        cut = len(current)
        while cut and current[cut - 1][1] is None:  # tags at the end stay outside
            cut -= 1
        trailing = [raw for raw, _ in current[cut:]]
        del current[cut:]
        if current and translatable("".join(t for _, t in current if t)):
            out.append(list(current))
        elif current:
            out.append("".join(raw for raw, _ in current))
        out.extend(trailing)
        current.clear()

    for index, (raw, text) in enumerate(runs):
        usable_text = text is not None and unescape(raw) == text
        if usable_text or (index in inline and current):
            current.append((raw, text if usable_text else None))
        else:
            flush()
            out.append(raw)
    flush()
    tags = sum(1 for part in out if isinstance(part, list) for _, t in part if t is None)
    if tags > protect.MAX_SPANS:  # too much markup for the sentinels: text runs one by one, as without them
        return _split_runs(runs)
    return out


def _split_runs(runs: list[tuple[str, str | None]]) -> list[str | list[tuple[str, str | None]]]:
    return [[(raw, text)] if text is not None and unescape(raw) == text and translatable(text) else raw
            for raw, text in runs]


def _mask_segment(segment: list[tuple[str, str | None]], first: int, foreign: Callable[[str], bool] | None = None,
                  terms: Terminology | None = None, annotate: bool = False) -> protect.Masked:
    """A segment's text with sentinels first, first + 1, ... for its spans: an inline tag is a span
    kept as written; a placeholder, URL, ... in the text is one kept escaped, as it was."""
    pieces, spans, entries, annotations = [], [""] * first, {}, []
    for raw, text in segment:
        if text is None or len(spans) >= protect.MAX_SPANS:
            if len(spans) < protect.MAX_SPANS:
                pieces.append(protect.sentinel(len(spans)))
                spans.append(raw)
            else:  # no sentinel left: the tag goes in as text (the model may garble it)
                pieces.append(unescape(raw))
            continue
        masked = protect.mask(text, first=len(spans), foreign=foreign, terms=terms, annotate_glossary=annotate)
        pieces.append(masked.text)
        spans += [escape(span, quote=False) for span in masked.spans[len(spans):]]
        entries.update(masked.terms)
        annotations += masked.annotations
    return protect.Masked("".join(pieces), spans, entries, annotations=annotations)
