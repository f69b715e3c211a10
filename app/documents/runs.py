"""A paragraph of several runs (pieces of text of one formatting) as one HTML text, and back.

    runs_html(["Click ", "Print", " now."])
    # '<span data-run="0">Click </span><span data-run="1">Print</span><span data-run="2"> now.</span>'
    html_runs(translated, 3)  # the text of each run in the translation

The tags travel through the model as protected spans and come back exactly once each
(model/protect.py repairs what the model drops), so each run gets the words the model wrote
inside its tags; words it wrote outside any run's tags join the run before them.
"""

from __future__ import annotations

import re
from html import escape, unescape

_TAG = re.compile(r'(<span data-run="(\d+)">|</span>)')


def runs_html(texts: list[str]) -> str:
    return "".join(f'<span data-run="{k}">{escape(text, quote=False)}</span>' for k, text in enumerate(texts))


def html_runs(html: str, count: int) -> list[str]:
    parts: list[list[str]] = [[] for _ in range(count)]
    current, last = None, 0
    pos = 0
    for tag in _TAG.finditer(html):
        text = html[pos:tag.start()]
        parts[current if current is not None else last].append(unescape(text))
        if tag.group(2) is not None:
            current = min(int(tag.group(2)), count - 1)
            last = current
        else:
            current = None
        pos = tag.end()
    parts[current if current is not None else last].append(unescape(html[pos:]))
    return ["".join(p) for p in parts]
