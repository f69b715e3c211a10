"""File formats of POST /translate_file: each reads a file into texts to translate and writes it
back with their translations, all else kept as it was.

    extracted = read(".docx", data)          # Extracted(texts, html, write)
    data = extracted.write(translations, "de")   # one translation per text, the target language

Each text is translated as a LibreTranslate `q` is: plain text or HTML (`html[i]`), cut into
sentences, its placeholders and inline tags protected (app/markup.py). Office formats give a
paragraph of several runs (pieces of one formatting) as HTML whose <span data-run="k"> elements
are the runs (runs.py), so a bold word moves with its translation and keeps its formatting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath


@dataclass
class Extracted:
    texts: list[str]
    html: list[bool]  # per text: HTML (else plain text)
    write: Callable[[list[str], str], bytes]  # (translations, target language) -> the translated file


class FormatError(ValueError):
    """The file is not what its extension says, or is damaged."""


def _readers() -> dict[str, Callable[[bytes], Extracted]]:
    from app.documents import epub, gettext, odf, office, plain, subtitles

    return {".txt": plain.read_text, ".html": plain.read_html, ".htm": plain.read_html, ".srt": subtitles.read,
            ".po": gettext.read, ".pot": gettext.read, ".docx": office.read_docx, ".pptx": office.read_pptx,
            ".odt": odf.read, ".odp": odf.read, ".epub": epub.read}


EXTENSIONS = [".txt", ".html", ".htm", ".srt", ".po", ".pot", ".docx", ".pptx", ".odt", ".odp", ".epub"]


def extensions() -> list[str]:
    return list(EXTENSIONS)


def extension(filename: str) -> str:
    return PurePath(filename).suffix.lower()


def read(filename: str, data: bytes) -> Extracted:
    """The texts of a file; FormatError when it cannot be read as its extension says."""
    reader = _readers()[extension(filename)]
    try:
        return reader(data)
    except (FormatError, MemoryError, RecursionError):
        raise
    except Exception as e:  # the libraries' own errors for a damaged file: zip, XML, polib
        raise FormatError(f"cannot read it as {extension(filename)}: {type(e).__name__}: {e}") from None


def output_name(filename: str, target: str) -> str:
    """'guide.docx' -> 'guide_de.docx'; a template comes back as a catalog ('app.pot' -> 'app_de.po')."""
    path = PurePath(PurePath(filename).name or "file")
    suffix = ".po" if path.suffix.lower() == ".pot" else path.suffix
    return f"{path.stem}_{target}{suffix}"


def decode(data: bytes) -> str:
    """UTF-8 text (a byte order mark dropped), else FormatError."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise FormatError(f"not UTF-8 text (byte 0x{data[e.start]:02X} at offset {e.start}): save it as UTF-8") \
            from None
