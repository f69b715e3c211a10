"""Plain text and HTML files: the whole file is one text (cut into sentences, line by line)."""

from __future__ import annotations

from app.documents import Extracted, decode


def read_text(data: bytes) -> Extracted:
    return Extracted([decode(data)], [False], lambda translations, target: translations[0].encode())


def read_html(data: bytes) -> Extracted:
    return Extracted([decode(data)], [True], lambda translations, target: translations[0].encode())
