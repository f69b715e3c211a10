"""Source `stories`: mission texts, campaigns and stamp descriptions of a few games."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from training.corpus.gettext import read_keyed, read_po

LUA_ENTRY_RE = re.compile(r'^\s*\["((?:[^"\\]|\\.)*)"\]\s*=\s*"((?:[^"\\]|\\.)*)"')
LUA_ESCAPE_RE = re.compile(r"\\(.)")
KEY_VALUE_RE = re.compile(r"^(\d+:\d+)=(.*)$")


def read_lua_table(path: Path) -> list[tuple[str, str]]:
    """Hedgewars' ``Locale/de.lua``: ``["English"] = "German",`` lines (untranslated ones are
    commented out with ``--``)."""
    def unescape(text: str) -> str:
        return LUA_ESCAPE_RE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), text)
    pairs = []
    for line in path.read_text("utf-8", "replace").splitlines():
        m = LUA_ENTRY_RE.match(line)
        if m:
            pairs.append((unescape(m.group(1)), unescape(m.group(2))))
    return pairs


def read_stamp_description(path: Path) -> list[tuple[str, str]]:
    """A Tux Paint stamp's ``.txt``: the English description on the first line, then one
    ``lang.utf8=text`` line per translation."""
    lines = path.read_text("utf-8", "replace").splitlines()
    german = [line.split("=", 1)[1] for line in lines[1:] if line.startswith("de.utf8=")]
    return [(lines[0], german[0])] if lines and german else []


def extract_stories(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from the ``stories`` packages; a unit is one file (one stamp's
    description, one campaign's catalog, Hedgewars' mission texts)."""
    for name in sorted(pkgs):
        root = pkgs[name]
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root)
            if path.name == "de.lua":
                pairs = read_lua_table(path)
            elif path.name == "de.txt" and (path.parent / "en.txt").exists():
                pairs = read_keyed(path.parent / "en.txt", path, KEY_VALUE_RE)
            elif path.name.endswith(".de.po"):
                pairs = read_po(path)
            elif "/stamps/" in f"/{rel}" and path.suffix == ".txt":
                pairs = read_stamp_description(path)
            else:
                continue
            for en, de in pairs:
                yield f"{name}/{rel.parent}/{rel.stem}", en, de
