"""Source `qtcatalogs`: Qt's .qm catalogs."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from pathlib import Path

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
