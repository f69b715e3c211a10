"""Source `lohelp`: LibreOffice help pages, paragraphs aligned by their ids."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

from training.corpus.common import progress, refine_paragraph


class _HelpParser(HTMLParser):
    """Collect text of ``<p>``/``<hN>`` elements whose id is ``par_id...``/``hd_id...``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: dict[str, str] = {}
        self.stack: list[tuple[str, str | None, bool]] = []  # (tag, block id, hidden)
        self.cur_id: str | None = None
        self.buf: list[str] = []
        self.hidden_depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("br", "img", "meta", "link", "input", "hr"):
            if tag == "br" and self.cur_id:
                self.buf.append(" ")
            return
        hid = a.get("id") or ""
        # switchinline: platform variants are hidden; keep only the "default" one
        hidden = "hidden" in a and not hid.startswith("default")
        block = None
        if self.cur_id is None and tag in ("p", "h1", "h2", "h3", "h4", "h5", "h6") \
                and re.match(r"(par|hd)_id", hid):
            block, self.cur_id, self.buf = hid, hid, []
        self.stack.append((tag, block, hidden))
        if hidden:
            self.hidden_depth += 1

    def handle_endtag(self, tag):
        while self.stack:
            t, block, hidden = self.stack.pop()
            if hidden:
                self.hidden_depth -= 1
            if block is not None:
                self.blocks.setdefault(block, "".join(self.buf))
                self.cur_id = None
            if t == tag:
                break

    def handle_data(self, data):
        if self.cur_id is not None and self.hidden_depth == 0:
            self.buf.append(data)


def help_blocks(path: Path) -> dict[str, str]:
    p = _HelpParser()
    p.feed(path.read_text("utf-8", "replace"))
    return p.blocks


def extract_lohelp(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from LibreOffice help pages, aligned by paragraph id."""
    en_root = pkgs["libreoffice-help-en-us"] / "usr/share/libreoffice/help/en-US"
    de_root = pkgs["libreoffice-help-de"] / "usr/share/libreoffice/help/de"
    pages = sorted(p.relative_to(en_root) for p in en_root.rglob("*.html"))
    for rel in progress(pages, "lohelp pages"):
        if not (de_root / rel).exists():
            continue
        be, bd = help_blocks(en_root / rel), help_blocks(de_root / rel)
        for pid, en in be.items():
            if pid in bd:
                for se, sd in refine_paragraph(en, bd[pid]):
                    yield str(rel), se, sd
