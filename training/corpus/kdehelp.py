"""Source `kdehelp`: KDE help pages (index.cache.bz2), aligned as `docs` aligns pages."""

from __future__ import annotations

import bz2
import re
from collections.abc import Iterator
from pathlib import Path

from training.corpus.docs import html_blocks, page_pairs

KDEHELP_LIST = Path(__file__).with_name("kdehelp_packages.txt")
KDEHELP_MEMBER_RE = re.compile(r"/usr/share/doc/HTML/(?:en|de)/.+/index\.cache\.bz2$")
KDE_PAGE_RE = re.compile(r'<FILENAME filename="([^"]+)">(.*?)</FILENAME>', re.S)


def kde_pages(path: Path) -> dict[str, str]:
    """A KDE handbook's index.cache.bz2 (every page kdoctools rendered, one after another, each in
    <FILENAME filename="...">): file name -> HTML."""
    with bz2.open(path, "rt", encoding="utf-8", errors="replace") as f:
        return {m.group(1): m.group(2) for m in KDE_PAGE_RE.finditer(f.read())}


def extract_kdehelp(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from the KDE handbooks of `pkgs`; a unit is one page of a handbook."""
    handbooks: dict[str, dict[str, Path]] = {"en": {}, "de": {}}
    for name in sorted(pkgs):
        for lang, books in handbooks.items():
            base = pkgs[name] / "usr/share/doc/HTML" / lang
            for cache in sorted(base.glob("**/index.cache.bz2")):
                books.setdefault(str(cache.parent.relative_to(base)), cache)
    for book, de_cache in sorted(handbooks["de"].items()):
        if book not in handbooks["en"]:
            continue
        en_pages, de_pages = kde_pages(handbooks["en"][book]), kde_pages(de_cache)
        for page in sorted(set(en_pages) & set(de_pages)):
            for en, de in page_pairs(html_blocks(en_pages[page]), html_blocks(de_pages[page])):
                yield f"{book}/{page}", en, de
