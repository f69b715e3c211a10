"""Source `gettext` (and `catalogs`): .mo and .po catalogs, and keyed string files of games."""

from __future__ import annotations

import re
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from training.corpus.common import CATALOG_MEMBER_RE, GETTEXT_PACKAGES, progress


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
