"""`nmt langid`: build the language profiles (langid.json, model/langid.py) from a corpus's
train.<lang> files and measure their accuracy on held-out sets."""

from __future__ import annotations

import sys
from pathlib import Path

from model.langid import TOP, LanguageIdentifier, build_profile, save_profiles
from training.corpus import read_lines


def accuracy(identifier: LanguageIdentifier, labelled: list[tuple[str, str]]) -> tuple[float, int]:
    """(share of texts whose best language is their label, number of texts)."""
    def best(text: str) -> str | None:
        guesses = identifier.detect(text)
        return guesses[0][0] if guesses else None

    right = sum(best(text) == label for text, label in labelled)
    return (right / len(labelled) if labelled else 0.0), len(labelled)


def langid_command(args) -> None:
    data, languages = Path(args.data), [code for code in args.langs.split(",") if code]
    profiles = {}
    for language in languages:
        profiles[language] = build_profile(read_lines(data / f"train.{language}"), args.top)
        print(f"{language}: {len(profiles[language].logprobs)} n-grams", file=sys.stderr, flush=True)
    save_profiles(profiles, args.out)
    print(f"wrote {args.out} ({Path(args.out).stat().st_size} bytes)")
    sets = [name for name in (args.test_sets or "").split(",") if name]
    if sets:
        print(accuracy_table(LanguageIdentifier(profiles), data, sets, languages))


def accuracy_table(identifier: LanguageIdentifier, data: Path, sets: list[str], languages: list[str]) -> str:
    """Markdown: accuracy per set and overall, on all lines and on lines under 20 characters (each
    line of NAME.<lang> labelled <lang>; a line without letters counts as wrong)."""
    labelled = {name: [(line, language) for language in languages
                       for line in read_lines(data / f"{name}.{language}") if line.strip()] for name in sets}
    labelled["all"] = [pair for name in sets for pair in labelled[name]]
    rows = ["| set | lines | accuracy | lines < 20 chars | accuracy |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, pairs in labelled.items():
        share, count = accuracy(identifier, pairs)
        short_share, short_count = accuracy(identifier, [(text, label) for text, label in pairs if len(text) < 20])
        rows.append(f"| {name} | {count} | {100 * share:.1f}% | {short_count} | {100 * short_share:.1f}% |")
    return "\n".join(rows)


def register(subparsers) -> None:
    p = subparsers.add_parser("langid", help="build language-identification profiles (langid.json)")
    p.add_argument("--data", required=True, help="directory with train.<lang> files")
    p.add_argument("--langs", required=True, help="comma-separated language codes, e.g. en,de")
    p.add_argument("--out", required=True, help="the langid.json to write")
    p.add_argument("--top", type=int, default=TOP, help="n-grams kept per language")
    p.add_argument("--test-sets", help="comma-separated set names (NAME.<lang> in --data, labelled by their "
                   "language) to measure accuracy on")
    p.set_defaults(func=langid_command)
