"""Source `manpages`: manual pages in both languages."""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path

from training.corpus.docs import page_pairs

MANPAGE_LIST = Path(__file__).with_name("manpage_packages.txt")
MANPAGE_MEMBER_RE = re.compile(r"/usr/share/man/(?:de/)?man\d/[^/]+\.gz$")
# pages that are lists of other pages' names (systemd's indexes): each version lists others, so
# blocks in the same place are different entries
MANPAGE_INDEXES = {"systemd.index.7.gz", "systemd.directives.7.gz"}
# macros that end a paragraph (and, but for the text-carrying ones, start the next)
ROFF_BREAKS = {"SH", "SS", "PP", "P", "LP", "TP", "TQ", "IP", "HP", "sp", "br", "RS", "RE", "SY", "YS", "OP", "TH",
               "in", "ti", "bp", "ce"}
# macros whose text is code, a table or a picture: skipped up to the macro that ends them
ROFF_SKIPS = {"TS": "TE", "EX": "EE", "nf": "fi", "PS": "PE", "EQ": "EN", "de": ".", "ig": "."}
# font macros: their arguments are text, in one font (B, I) or alternating without spaces (BR, ...)
ROFF_FONTS = {"B", "I", "SM", "SB"}
ROFF_ALTERNATING = {"BR", "RB", "BI", "IB", "IR", "RI"}
ROFF_GLYPHS = {"em": "—", "en": "–", "aq": "'", "dq": '"', "lq": "“", "rq": "”", "oq": "‘", "cq": "’",
               "Fo": "«", "Fc": "»", "fo": "‹", "fc": "›", "bu": "•", "co": "©", "rg": "®", "tm": "™",
               "mu": "×", "<=": "≤", ">=": "≥", "->": "→", "<-": "←", "ha": "^", "ti": "~", "hy": "-",
               "R": "®", "Tm": "™", "ga": "`", "aa": "´", "rs": "\\", "ss": "ß", ":a": "ä", ":o": "ö",
               ":u": "ü", ":A": "Ä", ":O": "Ö", ":U": "Ü", "de": "°", "pl": "+", "mi": "-", "eq": "="}
ROFF_ESCAPE_RE = re.compile(r"\\(?:f(?:\(..|\[[^]]*\]|.)|s[+-]?\d+|\*?\(..|\*?\[[^]]*\]|\*.|[nk]\S|.)")


def _roff_escape(m: re.Match) -> str:
    code = m.group(0)[1:]
    if code[0] == "f" or (code[0] == "s" and code[1:2] in "+-0123456789"):
        return ""  # a font or size change
    if code[0] == "*":
        code = code[1:]
    if code[0] == "(":
        return ROFF_GLYPHS.get(code[1:], "")
    if code[0] == "[":
        name = code[1:-1]
        if re.fullmatch(r"u[0-9A-F]{4,5}", name):
            return chr(int(name[1:], 16))
        return ROFF_GLYPHS.get(name, "")
    if code[0] in "nk" and len(code) == 2:
        return ""  # a number register
    return {"-": "-", "e": "\\", "~": " ", " ": " ", "0": " ", "`": "`", "'": "´", ".": "."}.get(
        code, ROFF_GLYPHS.get(code, ""))


def roff_text(line: str) -> str:
    """A roff text line as plain text: escapes resolved, fonts dropped, comments cut off."""
    line = re.split(r'\\"', line, maxsplit=1)[0]
    line = re.sub(r"(?<!\\)\[aq\]", "'", line)  # po4a writes some \[aq] without the backslash
    return ROFF_ESCAPE_RE.sub(_roff_escape, line)


def roff_args(text: str) -> list[str]:
    """A macro's arguments: split at spaces, "double quoted" ones kept whole ("" is a quote)."""
    args, i = [], 0
    while i < len(text):
        if text[i] == " ":
            i += 1
        elif text[i] == '"':
            j, arg = i + 1, []
            while j < len(text) and not (text[j] == '"' and text[j + 1:j + 2] != '"'):
                arg.append(text[j])
                j += 2 if text[j] == '"' else 1
            args.append("".join(arg))
            i = j + 1
        else:
            j = text.find(" ", i)
            j = len(text) if j < 0 else j
            args.append(text[i:j])
            i = j
    return args


def man_blocks(source: str) -> list[tuple[str, str]]:
    """(macro, text) of a man page's paragraphs in order: each paragraph named by the macro that
    began it (the tag line of a .TP is a block of its own, "tag", and its text "body"); code, tables
    and macro definitions are left out. A page that only includes another (.so) has none."""
    blocks: list[tuple[str, str]] = []
    name, words = "start", []
    skip_until, tag_next = None, False

    def close(next_name: str) -> None:
        nonlocal name, words
        text = " ".join(" ".join(words).split())
        if text:
            blocks.append((name, text))
        name, words = next_name, []

    def add(text: str) -> None:
        nonlocal words, tag_next
        if tag_next:  # the line after .TP is its tag
            close("tag")
            words, tag_next = [text], False
            close("body")
        else:
            words.append(text)

    for raw in source.splitlines():
        if skip_until is not None:
            if raw.startswith("." + skip_until) or (skip_until == "." and raw.strip() == ".."):
                skip_until = None
            continue
        if raw.startswith((".\\\"", "'\\\"", "\\\"")):
            continue  # a comment
        if not raw.startswith((".", "'")):
            add(roff_text(raw))
            continue
        macro, _, rest = raw[1:].strip().partition(" ")
        if macro == "so":
            return []
        if macro in ROFF_SKIPS:
            close("after-" + macro)
            skip_until = ROFF_SKIPS[macro]
        elif macro in ROFF_FONTS or macro in ROFF_ALTERNATING:
            args = [roff_text(a) for a in roff_args(rest)]
            add(" ".join(args) if macro in ROFF_FONTS else "".join(args))
        elif macro in ROFF_BREAKS:
            close(macro)
            if macro in ("SH", "SS") and rest:
                words = [roff_text(" ".join(roff_args(rest)))]
                close("after-" + macro)
            elif macro == "IP" and roff_args(rest):
                words = [roff_text(roff_args(rest)[0])]
                close("body")
            tag_next = macro in ("TP", "TQ")
        # other requests (.if, .ft, .UR, ...) carry no text of the paragraph
    close("end")
    return blocks


def read_man_page(path: Path) -> str:
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read()


def extract_manpages(german: Path, english: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from the man pages of manpages-de (extracted at `german`) and the
    English pages of the same name in the `english` packages; a unit is one page."""
    originals = {}
    for root in english.values():
        for page in (root / "usr/share/man").glob("man[0-9]/*.gz"):
            originals.setdefault(f"{page.parent.name}/{page.name}", page)
    for de_page in sorted((german / "usr/share/man/de").glob("man[0-9]/*.gz")):
        en_page = originals.get(f"{de_page.parent.name}/{de_page.name}")
        if en_page is None or not en_page.is_file() or de_page.name in MANPAGE_INDEXES:
            continue
        unit = f"{de_page.parent.name}/{de_page.name.removesuffix('.gz')}"
        for en, de in page_pairs(man_blocks(read_man_page(en_page)), man_blocks(read_man_page(de_page))):
            yield unit, en, de
