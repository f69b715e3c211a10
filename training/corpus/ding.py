"""Source `ding`: the Ding dictionary's example sentences and word entries; test_general comes from it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from training.corpus.common import SENT_END, normalize, progress, word_count

DING_ANNOT_RE = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|\([^()]*\)")


def ding_strip(text: str) -> str:
    """Remove Ding annotations ({f}, [comp.], (informal)) and tidy spaces."""
    prev = None
    while prev != text:  # nested annotations
        prev, text = text, DING_ANNOT_RE.sub("", text)
    return normalize(text)


def parse_ding_line(line: str) -> list[tuple[str, str]]:
    """Return aligned (en, de) pairs from one ``German :: English`` line."""
    if "::" not in line or line.startswith("#"):
        return []
    de_side, en_side = line.split("::", 1)
    de_alts, en_alts = de_side.split(" | "), en_side.split(" | ")
    if len(de_alts) != len(en_alts):
        return []
    pairs = []
    for d, e in zip(de_alts, en_alts):
        ds = [ding_strip(x) for x in d.split(";")]
        es = [ding_strip(x) for x in e.split(";")]
        if len(ds) == len(es):
            pairs.extend(zip(es, ds))
        else:
            pairs.append((es[0], ds[0]))  # synonym lists differ: first is the headword
    return [(e, d) for e, d in pairs if e and d]


DING_PACKAGE, DING_FILE = "trans-de-en", "usr/share/trans/de-en"
DING_SOURCES = ("ding", "ding_dict")  # example sentences, word/phrase glosses


def extract_ding(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str, str]]:
    """Yield (source, unit, en, de); example sentences are tagged ``ding``."""
    path = pkgs[DING_PACKAGE] / DING_FILE
    lines = path.read_text("utf-8", "replace").splitlines()
    for i, line in enumerate(progress(lines, "ding lines")):
        for en, de in parse_ding_line(line):
            sent = word_count(en) >= 4 and en.endswith(SENT_END)
            yield ("ding" if sent else "ding_dict"), f"line{i}", en, de
