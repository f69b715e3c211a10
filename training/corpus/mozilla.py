"""Source `mozilla`: Firefox's and Thunderbird's Fluent, .properties and .dtd strings."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

# each program's en-US strings (omni.ja) and its German language pack; zip files both
MOZILLA_PACKAGES = {"firefox-esr": "firefox-esr-l10n-de", "thunderbird": "thunderbird-l10n-de"}
MOZILLA_MEMBER_RE = re.compile(r"(/omni\.ja|/langpack-de@[\w.-]+\.xpi)$")
# a string file's place inside a zip, from the locale folder on ("toolkit/about/aboutPDF.ftl"):
# localization/en-US/X, browser/localization/de/X, chrome/en-US/locale/en-US/X, .../locale/browser/X
MOZILLA_PATH_RE = re.compile(r"(?:^|/)(?:localization/(?:en-US|de)|locale(?:/(?:en-US|de))?)/(.+\.(?:ftl|properties|dtd))$")
MOZILLA_SKIP_KEY_RE = re.compile(r"(?i)(accesskey|commandkey|\bkey$|\.key\b|-key$|shortcut|width|height|style)")
FLUENT_ENTRY_RE = re.compile(r"^(-?[A-Za-z][\w-]*) *=(.*)$")
FLUENT_ATTRIBUTE_RE = re.compile(r"^\s+\.([A-Za-z][\w-]*) *=(.*)$")
FLUENT_VARIABLE_RE = re.compile(r"\{ *\$([A-Za-z][\w-]*) *\}")
FLUENT_TERM_RE = re.compile(r"\{ *(-[A-Za-z][\w-]*) *\}")
PROPERTY_RE = re.compile(r"([^=:\s]+)\s*[=:]\s*(.*)$")
PROPERTY_ESCAPE_RE = re.compile(r"\\u([0-9a-fA-F]{4})|\\(.)")
DTD_ENTITY_RE = re.compile(r"<!ENTITY\s+([\w.-]+)\s+(?:\"([^\"]*)\"|'([^']*)')\s*>", re.S)


def read_fluent(text: str) -> dict[str, str]:
    """A Fluent file's messages, attributes ("id.attr") and terms ("-brand-short-name") -> their
    text on one line, { $var } written {var}. A value with a selector, or a placeable other than a
    variable or a term (a reference to another message), is left out: it is no single string."""
    entries: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("#"):
            current = None
        elif m := FLUENT_ENTRY_RE.match(line):
            current = m.group(1)
            entries[current] = [m.group(2).strip()]
        elif (m := FLUENT_ATTRIBUTE_RE.match(line)) and current:
            current = f"{current.split('.')[0]}.{m.group(1)}"
            entries[current] = [m.group(2).strip()]
        elif line[:1].isspace() and line.strip() and current:
            entries[current].append(line.strip())
    out = {}
    for key, lines in entries.items():
        value = " ".join(x for x in lines if x)
        placeables = re.findall(r"\{([^{}]*)\}", value)
        if value and "->" not in value and all(re.fullmatch(r" *[$-][A-Za-z][\w-]* *", p) for p in placeables):
            out[key] = FLUENT_VARIABLE_RE.sub(r"{\1}", value)
    return out


def resolve_terms(strings: dict[str, str]) -> dict[str, str]:
    """Fluent terms (-brand-short-name = Firefox) put into the strings that use them; a string
    with a term not defined in `strings` is left out."""
    terms = {k: v for k, v in strings.items() if k.startswith("-") and "{" not in v}
    out = {}
    for key, value in strings.items():
        if key.startswith("-"):
            continue
        used = FLUENT_TERM_RE.findall(value)
        if all(t in terms for t in used):
            out[key] = FLUENT_TERM_RE.sub(lambda m: terms[m.group(1)], value)
    return out


def read_properties(text: str) -> dict[str, str]:
    """A .properties file's key -> value (continuation lines joined, escapes resolved)."""
    out, logical = {}, ""
    for line in text.splitlines():
        logical += line.strip()
        if logical.endswith("\\") and not logical.endswith("\\\\"):
            logical = logical[:-1]  # the value goes on on the next line
            continue
        if (m := PROPERTY_RE.match(logical)) and not logical.startswith(("#", "!")):
            out[m.group(1)] = PROPERTY_ESCAPE_RE.sub(
                lambda e: chr(int(e.group(1), 16)) if e.group(1) else {"n": " ", "t": " "}.get(e.group(2), e.group(2)),
                m.group(2))
        logical = ""
    return out


def read_dtd(text: str) -> dict[str, str]:
    """A .dtd file's <!ENTITY name "value"> -> value."""
    return {m.group(1): m.group(2) if m.group(2) is not None else m.group(3) for m in DTD_ENTITY_RE.finditer(text)}


def mozilla_strings(archives: list[Path]) -> dict[str, str]:
    """Every string of these zip files (omni.ja or a language pack): "file|key" -> text, the file
    named from its locale folder on, so that an en-US file and its German one get the same name."""
    files: dict[str, str] = {}
    for archive in archives:
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                if m := MOZILLA_PATH_RE.search(member):
                    files.setdefault(m.group(1), z.read(member).decode("utf-8", "replace"))
    strings: dict[str, str] = {}
    fluent: dict[str, str] = {}
    for name, text in files.items():
        if name.endswith(".ftl"):
            entries = read_fluent(text)
            fluent.update({f"{name}|{k}": v for k, v in entries.items() if not k.startswith("-")})
            fluent.update({k: v for k, v in entries.items() if k.startswith("-")})  # terms, by their name
        else:
            reader = read_properties if name.endswith(".properties") else read_dtd
            strings.update({f"{name}|{k}": v for k, v in reader(text).items()})
    strings.update(resolve_terms(fluent))
    return strings


def extract_mozilla(pkgs: dict[str, Path]) -> Iterator[tuple[str, str, str]]:
    """Yield (unit, en, de) from Firefox and Thunderbird, string by string; a unit is one file."""
    for program, langpack in MOZILLA_PACKAGES.items():
        english = mozilla_strings(sorted(pkgs[program].rglob("omni.ja")))
        german = mozilla_strings(sorted(pkgs[langpack].rglob("*.xpi")))
        for key in sorted(english.keys() & german.keys()):
            file, _, name = key.partition("|")
            en, de = english[key], german[key]
            if MOZILLA_SKIP_KEY_RE.search(name) or len(en) < 2 or ("#1" in en and ";" in en):
                continue  # access keys, sizes, and plural forms ("#1 tab;#1 tabs")
            yield f"{program}/{file}", en, de
