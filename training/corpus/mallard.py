"""Sources `mallard` and `gnomehelp`: GNOME Mallard help pages, blocks aligned when their sequences match."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

from training.corpus.common import progress, refine_paragraph

MAL = "{http://projectmallard.org/1.0/}"
MAL_BLOCKS = {"title", "desc", "p"}
MAL_SKIP = {"credit", "license", "revision", "code", "screen", "comment", "media", "include"}


def mallard_text(el: ET.Element) -> str:
    """Inner text of a block; ``<keyseq>`` keys are joined with "+" as Yelp renders them."""
    kids = [k for k in el if isinstance(k.tag, str)]
    if el.tag == MAL + "keyseq" and kids:
        return "+".join(mallard_text(k).strip() for k in kids)
    parts = [el.text or ""]
    for child in el:
        if isinstance(child.tag, str) and child.tag.replace(MAL, "") not in MAL_SKIP:
            parts.append(mallard_text(child))
        parts.append(child.tail or "")
    return "".join(parts)


def mallard_blocks(path: Path) -> list[tuple[str, str | None]]:
    """Return (tag, text) for title/desc/p blocks in order; text None if unusable."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return []
    out: list[tuple[str, str | None]] = []

    def walk(el: ET.Element) -> None:
        name = el.tag.replace(MAL, "") if isinstance(el.tag, str) else ""
        if name in MAL_SKIP or "}" in name:
            return  # foreign namespaces (its:, mal:credit, xi:) and metadata
        if name in MAL_BLOCKS:
            # an empty <link xref/> renders the target's title: the text has a hole
            holes = any(c.tag == MAL + "link" and not "".join(c.itertext()).strip()
                        for c in el.iter())
            out.append((name, None if holes else mallard_text(el)))
            return
        for child in el:
            walk(child)

    walk(root)
    return out


def extract_mallard(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from the Mallard pages of `pkgs` whose block sequences match."""
    pages = []
    for name in pkgs:  # in the given order: dedup keeps the first of equal pairs
        base = pkgs[name] / "usr/share/help"
        for c in sorted(base.glob("C/*/*.page")):
            d = base / "de" / c.parent.name / c.name
            if d.exists():
                pages.append((c, d))
    for c, d in progress(pages, "mallard pages"):
        bc, bd = mallard_blocks(c), mallard_blocks(d)
        if [t for t, _ in bc] != [t for t, _ in bd]:
            continue
        unit = f"{c.parent.name}/{c.stem}"
        for (_, e), (_, g) in zip(bc, bd):
            if e and g:
                for se, sd in refine_paragraph(e, g):
                    yield unit, se, sd


GNOMEHELP_LIST = Path(__file__).with_name("gnomehelp_packages.txt")
GNOMEHELP_MEMBER_RE = re.compile(r"/usr/share/help/(?:C|de)/[^/]+/[^/]+\.page$")
