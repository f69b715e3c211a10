"""Source `ddtp`: Debian package descriptions and their German translations."""

from __future__ import annotations

import glob
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

from training.corpus.common import ensure_apt_lists, progress, refine_paragraph


def read_translation_file(path: Path, lang: str) -> dict[str, tuple[str, str]]:
    """Parse a DDTP Translation file: md5 -> (package, description text)."""
    text = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(path)], check=True,
                          capture_output=True).stdout.decode("utf-8", "replace")
    out: dict[str, tuple[str, str]] = {}
    for block in text.split("\n\n"):
        pkg = md5 = None
        desc: list[str] = []
        in_desc = False
        for line in block.split("\n"):
            if line.startswith("Package: "):
                pkg, in_desc = line[9:].strip(), False
            elif line.startswith("Description-md5: "):
                md5, in_desc = line[17:].strip(), False
            elif line.startswith(f"Description-{lang}: "):
                desc, in_desc = [line.split(": ", 1)[1]], True
            elif in_desc and line.startswith(" "):
                desc.append(line)
        if pkg and md5 and desc and md5 not in out:
            out[md5] = (pkg, "\n".join(desc))
    return out


def ddtp_blocks(desc: str) -> list[str]:
    """Split a description into synopsis, paragraphs (`` .`` lines) and bullet items."""
    lines = desc.split("\n")
    blocks, cur = [lines[0]], []
    for line in lines[1:]:
        s = line[1:] if line.startswith(" ") else line
        if s.strip() == ".":
            blocks.append(" ".join(cur))
            cur = []
        elif re.match(r"\s*[-*+o]\s", s) and cur:
            blocks.append(" ".join(cur))  # a bullet item starts a new block
            cur = [s]
        else:
            cur.append(s)
    blocks.append(" ".join(cur))
    # drop the bullet glyph itself: it is layout, not text
    return [re.sub(r"^\s*[-*+o]\s+", "", b).strip() for b in blocks if b.strip()]


def extract_ddtp(cache_dir: Path) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from DDTP descriptions paired by Description-md5."""
    lists = ensure_apt_lists(cache_dir)
    de_file = sorted(glob.glob(str(lists / "*bookworm_main_i18n_Translation-de*")))[0]
    en_file = sorted(glob.glob(str(lists / "*bookworm_main_i18n_Translation-en*")))[0]
    de = read_translation_file(Path(de_file), "de")
    en = read_translation_file(Path(en_file), "en")
    for md5 in progress(sorted(de), "ddtp descriptions"):
        if md5 not in en:
            continue
        pkg, en_desc = en[md5]
        be, bd = ddtp_blocks(en_desc), ddtp_blocks(de[md5][1])
        if len(be) != len(bd):
            be, bd = be[:1], bd[:1]  # paragraphs diverge: keep only the synopsis
        for e, d in zip(be, bd):
            for se, sd in refine_paragraph(e, d):
                yield pkg, se, sd
