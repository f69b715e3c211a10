"""What an uploaded file may hold, checked on its raw bytes before any parser sees them.

A zip-based document (docx, pptx, odt, odp, epub) is a zip archive of XML parts: 5 MB of it can
inflate to gigabytes, or declare a million members, or nest XML elements a million deep. So:

    check_file(".docx", data, limits)   # raises TooLarge (413) or FormatError (400), else returns

- the number of members, read from the archive's end record before the directory is parsed;
- each member's declared size and compression ratio, and all declared sizes together;
- every member inflated as a stream, in chunks, against a hard byte budget (a member's header
  can lie about its size), and each XML part scanned on the way for its element depth and for
  entity declarations (the "billion laughs"), with expat, which keeps no tree.

The checks run in the document reader's own process (app/documents/isolated.py), under its memory
cap, like the parsers after them.
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass
from xml.parsers import expat

from app.documents import FormatError

ZIP_FORMATS = (".docx", ".pptx", ".odt", ".odp", ".epub")
XML_SUFFIXES = (".xml", ".rels", ".xhtml", ".html", ".htm", ".opf", ".ncx", ".svg")
CHUNK = 1 << 16
# A member this small may compress at any ratio (a part of repeated style runs compresses ~200:1);
# the ratio check applies to larger ones.
RATIO_FREE_BYTES = 1 << 20


@dataclass(frozen=True)
class Limits:
    """One field per limit; the setting that holds each is named in its error message."""

    max_zip_members: int = 2000  # NMT_MAX_ZIP_MEMBERS
    max_unzipped_bytes: int = 100 * 2**20  # NMT_MAX_UNZIPPED_BYTES
    max_zip_ratio: float = 100.0  # NMT_MAX_ZIP_RATIO
    max_xml_depth: int = 256  # NMT_MAX_XML_DEPTH
    max_texts: int = 20_000  # NMT_MAX_FILE_TEXTS
    max_chars: int = 200_000  # NMT_MAX_FILE_CHARS
    max_output_bytes: int = 256 * 2**20  # NMT_FILE_STORE_BYTES
    memory_bytes: int = 256 * 2**20  # NMT_DOCUMENT_MEMORY_BYTES
    timeout_s: float = 60.0  # NMT_DOCUMENT_TIMEOUT_S


class TooLarge(Exception):
    """The file passes a limit: 413, with the limit and its setting in the message."""


def check_file(extension: str, data: bytes, limits: Limits) -> None:
    if extension in ZIP_FORMATS:
        try:
            check_zip(data, limits)
        except FormatError as e:
            raise FormatError(f"cannot read it as {extension}: {e}") from None


# --- zip archives --------------------------------------------------------------------------------

_END = b"PK\x05\x06"  # end of central directory record, 22 bytes plus a comment of up to 65,535
_END64_LOCATOR = b"PK\x06\x07"  # zip64 end of central directory locator, 20 bytes, just before it


def declared_members(data: bytes) -> int:
    """The member count the archive's end record declares (zip64's when it has one), read without
    parsing the central directory, whose every entry zipfile would hold in memory."""
    at = data.rfind(_END, max(0, len(data) - 22 - 65535))
    if at < 0 or len(data) < at + 22:
        raise FormatError("not a zip archive (no end of central directory record)")
    count = struct.unpack_from("<H", data, at + 10)[0]
    locator = at - 20
    if count == 0xFFFF and locator >= 0 and data[locator:locator + 4] == _END64_LOCATOR:
        end64 = struct.unpack_from("<Q", data, locator + 8)[0]
        if end64 + 56 > len(data) or data[end64:end64 + 4] != b"PK\x06\x06":
            raise FormatError("damaged zip64 end record")
        count = struct.unpack_from("<Q", data, end64 + 32)[0]
    return count


def check_zip(data: bytes, limits: Limits) -> None:
    members = declared_members(data)
    if members > limits.max_zip_members:
        raise TooLarge(f"the archive has {members:,} members; at most {limits.max_zip_members:,} "
                       "(NMT_MAX_ZIP_MEMBERS)")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, struct.error) as e:
        raise FormatError(f"damaged zip archive: {e}") from None
    infos = archive.infolist()
    if len(infos) > limits.max_zip_members:  # the end record can understate it
        raise TooLarge(f"the archive has {len(infos):,} members; at most {limits.max_zip_members:,} "
                       "(NMT_MAX_ZIP_MEMBERS)")
    declared = sum(i.file_size for i in infos)
    if declared > limits.max_unzipped_bytes:
        raise TooLarge(f"the archive inflates to {declared:,} bytes; at most {limits.max_unzipped_bytes:,} "
                       "(NMT_MAX_UNZIPPED_BYTES)")
    for info in infos:
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > RATIO_FREE_BYTES and ratio > limits.max_zip_ratio:
            raise TooLarge(f"member {info.filename!r} inflates {ratio:,.0f}-fold ({info.compress_size:,} to "
                           f"{info.file_size:,} bytes); at most {limits.max_zip_ratio:g}-fold (NMT_MAX_ZIP_RATIO)")
    budget = limits.max_unzipped_bytes
    for info in infos:
        budget -= _inflate(archive, info, budget, limits)


def _inflate(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: int, limits: Limits) -> int:
    """Inflate one member chunk by chunk, never more than `budget` bytes; XML parts go through
    the depth and entity scan. Returns the bytes it inflated to."""
    scan = _XmlScan(info.filename, limits.max_xml_depth) if info.filename.lower().endswith(XML_SUFFIXES) else None
    inflated = 0
    try:
        with archive.open(info) as member:
            while chunk := member.read(CHUNK):
                inflated += len(chunk)
                if inflated > budget:
                    raise TooLarge(f"the archive inflates to more than {limits.max_unzipped_bytes:,} bytes "
                                   "(NMT_MAX_UNZIPPED_BYTES)")
                if scan:
                    scan.feed(chunk)
    except (TooLarge, FormatError):
        raise
    except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError, ValueError, RuntimeError) as e:
        # a bad CRC, an unknown compression method, a truncated stream, an encrypted member
        raise FormatError(f"damaged zip member {info.filename!r}: {e}") from None
    return inflated


class _XmlScan:
    """Counts element depth over a stream of XML; refuses entity declarations. Keeps no tree. A
    part expat cannot parse is left to the real parser (some readers are lenient), unscanned."""

    def __init__(self, name: str, max_depth: int):
        self.name, self.max_depth, self.depth = name, max_depth, 0
        self.parser: expat.XMLParserType | None = expat.ParserCreate()
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.parser.EntityDeclHandler = self._entity

    def _start(self, name, attributes) -> None:
        self.depth += 1
        if self.depth > self.max_depth:
            raise TooLarge(f"{self.name!r} nests XML elements more than {self.max_depth:,} deep "
                           "(NMT_MAX_XML_DEPTH)")

    def _end(self, name) -> None:
        self.depth -= 1

    def _entity(self, name, *rest) -> None:
        raise FormatError(f"{self.name!r} declares XML entities ({name!r}), which documents of this kind never do")

    def feed(self, chunk: bytes) -> None:
        if self.parser is None:
            return
        try:
            self.parser.Parse(chunk, False)
        except expat.ExpatError:
            self.parser = None
