"""Characters a text may hold that the model never saw in training, made harmless before it reads them.

Invisible control characters make a trained model babble ("RTLilberberberberber..."), so:

- removed: C0 and C1 control characters (U+0000-U+001F, U+007F-U+009F) except tab, line feed,
  carriage return and next line; the bidirectional embeddings, overrides and isolates
  (U+202A-U+202E, U+2066-U+2069) and marks (U+200E, U+200F, U+061C); the byte order mark
  U+FEFF; the noncharacters U+FFFE and U+FFFF;
- made a line feed: vertical tab, form feed, next line (U+0085), line and paragraph separators
  (U+2028, U+2029): line breaks, which end a sentence;
- refused (`lone_surrogate`): a lone UTF-16 surrogate (U+D800-U+DFFF, reachable through a JSON
  escape such as "\\ud800") is not a character at all, and no UTF-8 text can hold one.

Everything else, zero-width joiners (emoji sequences) and spaces included, is kept as written.
"""

from __future__ import annotations

import re

_LINE_BREAKS = "\x0b\x0c\x85\u2028\u2029"
_REMOVED = "\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\ufeff\ufffe\uffff"
_REMOVED_RE = re.compile(f"[{_REMOVED}]")
_LINE_BREAK_RE = re.compile(f"[{_LINE_BREAKS}]")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """The text with control and bidi-control characters removed and odd line breaks made "\\n"."""
    if text.isprintable():  # the common case: nothing to do (tab and newline are not printable)
        return text
    return _LINE_BREAK_RE.sub("\n", _REMOVED_RE.sub("", text))


def lone_surrogate(text: str) -> int | None:
    """The position of the first lone surrogate in `text`, or None when it is valid Unicode."""
    found = _SURROGATE_RE.search(text)
    return None if found is None else found.start()
