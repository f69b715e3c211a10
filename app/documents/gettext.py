"""gettext catalogs (.po, and .pot templates, which come back as .po): every entry without a
translation gets one, marked `fuzzy` so translators review it, as they expect of machine
translation; msgid, msgctxt, comments, references, flags and existing translations stay as they
were. A plural entry gets msgstr[0] from msgid and the other forms from msgid_plural."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import polib

from app.documents import Extracted, FormatError, decode

PLURAL_FORMS = "nplurals=2; plural=(n != 1);"  # German's and English's (the served languages)
MAX_PLURAL_FORMS = 6  # no language has more (Arabic has six)


def _plurals(po: polib.POFile) -> int:
    found = re.search(r"nplurals\s*=\s*(\d+)", po.metadata.get("Plural-Forms", ""))
    return max(1, min(int(found.group(1)), 6)) if found else 2


def _parse(text: str) -> polib.POFile:
    """The catalog in `text`. polib.pofile takes a string for a path whenever a file of that name
    exists, so an upload holding "/etc/passwd" would read that file: it is only ever given the
    path of a file written here."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "upload.po"
        path.write_text(text, encoding="utf-8")
        try:
            return polib.pofile(str(path), encoding="utf-8")
        except (OSError, ValueError) as e:  # polib's syntax errors name the file: ours, of no use to a client
            raise FormatError(f"not a gettext catalog: {str(e).replace(str(path), 'the file')}") from None


def read(data: bytes) -> Extracted:
    po = _parse(decode(data))
    for e in po:
        if len(e.msgstr_plural) > MAX_PLURAL_FORMS:
            raise FormatError(f"the entry {e.msgid[:40]!r} has {len(e.msgstr_plural):,} plural forms; a language has "
                              f"at most {MAX_PLURAL_FORMS}")
    entries = [e for e in po if not e.obsolete and e.msgid and not e.translated() and "fuzzy" not in e.flags]
    texts = []
    for e in entries:
        texts += [e.msgid, e.msgid_plural] if e.msgid_plural else [e.msgid]

    def write(translations: list[str], target: str) -> bytes:
        if any(e.msgid_plural for e in entries) and "Plural-Forms" not in po.metadata:
            po.metadata["Plural-Forms"] = PLURAL_FORMS
        plurals = _plurals(po)
        found = iter(translations)
        for e in entries:
            if e.msgid_plural:
                singular, plural = next(found), next(found)
                e.msgstr_plural = {k: singular if k == 0 else plural for k in range(plurals)}
            else:
                e.msgstr = next(found)
            e.flags.append("fuzzy")
        po.metadata["Content-Type"] = "text/plain; charset=UTF-8"
        po.metadata["Language"] = target
        return str(po).encode()

    return Extracted(texts, [False] * len(texts), write)
