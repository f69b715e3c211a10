"""SubRip (.srt) subtitles: each cue's text is translated as one text (its lines joined, since a
sentence often runs across them) and written back on as many lines as it had, cut at the space
nearest the middle; numbers and timings are kept as written."""

from __future__ import annotations

import re

from app.documents import Extracted, FormatError, decode

_TIMING = re.compile(r"^\s*\d+:\d+:\d+[,.]\d+\s*-->\s*\d+:\d+:\d+[,.]\d+")


def _lines(text: str, count: int) -> list[str]:
    """`text` on `count` lines, cut at the spaces nearest to equal shares."""
    lines = []
    for k in range(count - 1, 0, -1):
        target = len(text) * k // (k + 1)
        spaces = [i for i, c in enumerate(text) if c == " "]
        if not spaces:
            break
        cut = min(spaces, key=lambda i: abs(i - target))
        lines.insert(0, text[cut + 1:])
        text = text[:cut]
    return [text, *lines]


def read(data: bytes) -> Extracted:
    content = decode(data)
    newline = "\r\n" if "\r\n" in content else "\n"
    blocks = re.split(r"(?:\r?\n){2,}", content.strip("\r\n"))
    cues = []  # (head lines, text lines)
    for block in blocks:
        lines = block.splitlines()
        timing = next((i for i, line in enumerate(lines[:2]) if _TIMING.match(line)), None)
        if timing is None:
            raise FormatError(f"not a SubRip cue (no 'hh:mm:ss,mmm --> hh:mm:ss,mmm' line): {block[:60]!r}")
        cues.append((lines[:timing + 1], lines[timing + 1:]))
    texts = [" ".join(line.strip() for line in text) for _, text in cues]

    def write(translations: list[str], target: str) -> bytes:
        out = []
        for (head, text), translation in zip(cues, translations):
            body = _lines(translation, len(text)) if len(text) > 1 else [translation] if text else []
            out.append(newline.join(head + body))
        return (newline * 2).join(out).encode() + newline.encode()

    return Extracted(texts, [False] * len(texts), write)
