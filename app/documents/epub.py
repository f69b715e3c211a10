"""EPUB books (EbookLib): each XHTML document of the book is an HTML text; the package, table of
contents, styles and images are kept."""

from __future__ import annotations

import tempfile
from pathlib import Path

from app.documents import Extracted, decode


def read(data: bytes) -> Extracted:
    import ebooklib
    from ebooklib import epub

    with tempfile.TemporaryDirectory() as tmp:  # EbookLib reads and writes paths
        path = Path(tmp) / "in.epub"
        path.write_bytes(data)
        book = epub.read_epub(str(path), {"ignore_ncx": True})
    items = list(book.get_items_of_type(ebooklib.ITEM_DOCUMENT))
    texts = [decode(item.get_content()) for item in items]

    def write(translations: list[str], target: str) -> bytes:
        for item, translation in zip(items, translations):
            item.set_content(translation.encode())
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "out.epub"
            epub.write_epub(str(path), book, {"raise_exceptions": True})
            return path.read_bytes()

    return Extracted(texts, [True] * len(texts), write)
