"""Source `docs`: Debian's own books in both languages, HTML blocks of a page aligned by their tags."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from training.corpus.common import refine_paragraph


@dataclass(frozen=True)
class Book:
    """One of Debian's books in both languages: where each package keeps its HTML pages, and
    the German file name of an English page."""

    name: str
    en_package: str
    en_dir: str
    de_package: str
    de_dir: str
    en_suffix: str = ".html"  # an English page's name ends so; the German one ends in de_suffix
    de_suffix: str = ".html"


BOOKS = [
    Book("debian-reference", "debian-reference-en", "usr/share/debian-reference",
         "debian-reference-de", "usr/share/debian-reference", ".en.html", ".de.html"),
    Book("debian-faq", "debian-faq", "usr/share/doc/debian/FAQ",
         "debian-faq-de", "usr/share/doc/debian/FAQ/de", ".en.html", ".de.html"),
    Book("maint-guide", "maint-guide", "usr/share/doc/maint-guide/html",
         "maint-guide-de", "usr/share/doc/maint-guide-de/html", ".en.html", ".de.html"),
    Book("developers-reference", "developers-reference", "usr/share/developers-reference",
         "developers-reference-de", "usr/share/developers-reference/de"),
    Book("debian-handbook", "debian-handbook", "usr/share/doc/debian-handbook/html/en-US",
         "debian-handbook", "usr/share/doc/debian-handbook/html/de-DE"),
]
DOCS_PACKAGES = sorted({b.en_package for b in BOOKS} | {b.de_package for b in BOOKS})
# a page's text blocks; Publican (the Handbook) writes a paragraph as <div class="para">
DOC_BLOCKS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "li", "td", "th", "caption", "figcaption"}
DOC_VOID = {"br", "img", "meta", "link", "input", "hr", "col", "area", "base", "wbr", "source"}
# not text of the book: code, page furniture, navigation (DocBook's, Publican's, Sphinx's)
DOC_SKIP_TAGS = {"head", "pre", "script", "style", "nav"}
DOC_SKIP_CLASSES = {"navheader", "navfooter", "docnav", "related", "sphinxsidebar", "footer", "headerlink",
                    "navCenter", "navigation", "bottom-nav", "programlisting", "screen", "synopsis"}
# a run of blocks whose tags agree on both sides counts as aligned only from this length on
DOC_MIN_RUN = 4
DOC_WORD_RE = re.compile(r"[^\W\d_]{3,}")


class _DocParser(HTMLParser):
    """(name, text) of a page's text blocks in document order; text is None for a block that
    holds another block (a list item made of paragraphs), so both sides keep the same shape."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str, str | None]] = []
        self.open: list[tuple[str, bool, str | None]] = []  # (tag, skipped, block name if it starts one)
        self.skipping = 0
        self.text: list[str] | None = None  # the open block's text

    def handle_starttag(self, tag, attrs):
        if tag in DOC_VOID:
            if tag == "br" and self.text is not None:
                self.text.append(" ")
            return
        classes = set((dict(attrs).get("class") or "").split())
        skipped = tag in DOC_SKIP_TAGS or bool(classes & DOC_SKIP_CLASSES)
        block = None
        if not self.skipping and not skipped and (tag in DOC_BLOCKS or (tag == "div" and "para" in classes)):
            block = "p" if tag == "div" else tag
            if self.text is not None:  # a block inside a block: the outer one has no text of its own
                self.blocks.append((next(b for _, _, b in reversed(self.open) if b), None))
            self.text = []
        self.skipping += skipped
        self.open.append((tag, skipped, block))

    def handle_endtag(self, tag):
        if all(t != tag for t, _, _ in self.open):
            return  # a stray end tag
        while self.open:
            t, skipped, block = self.open.pop()
            self.skipping -= skipped
            if block and self.text is not None:
                self.blocks.append((block, " ".join("".join(self.text).split())))
                self.text = None
            if t == tag:
                break

    def handle_data(self, data):
        if self.text is not None and not self.skipping:
            self.text.append(data)


def doc_blocks(path: Path) -> list[tuple[str, str | None]]:
    return html_blocks(path.read_text("utf-8", "replace"))


def html_blocks(html: str) -> list[tuple[str, str | None]]:
    parser = _DocParser()
    parser.feed(html)
    parser.close()
    return [(tag, text) for tag, text in parser.blocks if text != ""]


def align_blocks(en: list[tuple[str, str | None]], de: list[tuple[str, str | None]]) -> list[tuple[str, str]]:
    """Text pairs of two pages' blocks: all of them when the tag sequences are equal, else those
    in runs of at least DOC_MIN_RUN blocks whose tags agree (a translation a version behind). A
    run is left out when its lengths say it is shifted (in_step)."""
    en_tags, de_tags = [t for t, _ in en], [t for t, _ in de]
    if en_tags == de_tags:
        runs = [(0, 0, len(en))]
    else:
        matcher = difflib.SequenceMatcher(None, en_tags, de_tags, autojunk=False)
        runs = [(a, b, n) for a, b, n in matcher.get_matching_blocks() if n >= DOC_MIN_RUN]
    pairs = []
    for a, b, n in runs:
        run = [(e, g) for (_, e), (_, g) in zip(en[a:a + n], de[b:b + n]) if e and g]
        if in_step(run):
            pairs += run
    return pairs


def in_step(pairs: list[tuple[str, str]]) -> bool:
    """Whether a run of block pairs is aligned, judged by length as Gale and Church (1993) did: a
    translation's length follows its original's, so among the pairs of 40 characters or more at
    most one in ten may have a German side under 0.6 or over 2 times as long. A run shifted by one
    block (a paragraph the other version lacks, under the same tags) breaks that."""
    long = [(e, g) for e, g in pairs if len(e) >= 40]
    outliers = sum(not 0.6 <= len(g) / len(e) <= 2.0 for e, g in long)
    return len(long) < 3 or outliers <= 0.1 * len(long)


def left_in_english(en: str, de: str) -> bool:
    """A German block that still is English: of its five or more words, 90% are the English
    block's ("Chapter 14, Security" translated inside an untranslated paragraph, say)."""
    de_words = [w.casefold() for w in DOC_WORD_RE.findall(de)]
    en_words = {w.casefold() for w in DOC_WORD_RE.findall(en)}
    return len(de_words) >= 5 and sum(w in en_words for w in de_words) >= 0.9 * len(de_words)


def page_pairs(en: list[tuple[str, str | None]], de: list[tuple[str, str | None]]) -> Iterator[tuple[str, str]]:
    """The sentence pairs of two versions of a page, given as blocks: blocks aligned
    (align_blocks), split into sentences where both split alike, German left in English dropped."""
    for en_block, de_block in align_blocks(en, de):
        for se, sd in refine_paragraph(en_block, de_block):
            if not left_in_english(se, sd):
                yield se, sd


def extract_docs(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from Debian's books; a unit is one page."""
    for book in BOOKS:
        en_root, de_root = pkgs[book.en_package] / book.en_dir, pkgs[book.de_package] / book.de_dir
        for en_page in sorted(en_root.glob(f"*{book.en_suffix}")):
            de_page = de_root / (en_page.name.removesuffix(book.en_suffix) + book.de_suffix)
            if not de_page.exists():
                continue
            for en, de in page_pairs(doc_blocks(en_page), doc_blocks(de_page)):
                yield f"{book.name}/{en_page.stem}", en, de
