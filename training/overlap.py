"""How much of test_general's Ding dictionary line a training corpus holds, and what a model scores
on the held-out sentences with and without such "siblings" in training.

A Ding line is one dictionary entry: a headword, its glosses and its example sentences
(``parse_ding_line``). test_general holds out single example sentences; a training set that keeps
the rest of the line teaches the idiom the held-out sentence tests ("in the first place" ->
"von Anfang an" beside "Why didn't you say so in the first place?"). ``nmt corpus`` has dropped
those siblings since the corpus-v4 build; this reports the overlap of any corpus and, given a
model's hypotheses, chrF on each part:

    python -m training.overlap --data data/corpus --cache /work/cache \\
        --hyp HYP_DIR/test_general.beam4.de
"""
from __future__ import annotations

import argparse
from pathlib import Path

from training.corpus import DING_FILE, DING_PACKAGE, DING_SOURCES, fetch_packages, normalize, parse_ding_line
from training.evaluate import score


def is_phrase(en: str) -> bool:
    """Dictionary phrases in Ding's notation ("to call back <> sb.") rather than sentences."""
    return en.startswith("to ") or " sth." in en or " sb." in en


def sibling_flags(ding_lines: list[str], test: list[tuple[str, str]],
                  train: set[tuple[str, str]]) -> list[bool]:
    """For each test pair: does another pair of its Ding line occur in ``train``?"""
    index = {pair: i for i, pair in enumerate(test)}
    flags = [False] * len(test)
    for line in ding_lines:
        pairs = [(normalize(en), normalize(de)) for en, de in parse_ding_line(line)]
        held = [index[p] for p in pairs if p in index]
        if held and any(p not in index and p in train for p in pairs):
            for i in held:
                flags[i] = True
    return flags


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="corpus directory (train.*, test_general.*)")
    ap.add_argument("--cache", required=True, help="nmt corpus cache (holds the extracted trans-de-en)")
    ap.add_argument("--hyp", help="hypotheses for test_general, one per line")
    a = ap.parse_args(argv)
    data = Path(a.data)
    ding = fetch_packages([DING_PACKAGE], Path(a.cache))[DING_PACKAGE] / DING_FILE  # cached by nmt corpus
    ding_lines = ding.read_text("utf-8", "replace").splitlines()
    src = (data / "test_general.en").read_text("utf-8").splitlines()
    ref = (data / "test_general.de").read_text("utf-8").splitlines()
    train = set()
    with open(data / "train.source") as s, open(data / "train.en") as e, open(data / "train.de") as d:
        for source, en, de in zip(s, e, d):
            if source.strip() in DING_SOURCES:
                train.add((en.rstrip("\n"), de.rstrip("\n")))
    flags = sibling_flags(ding_lines, list(zip(src, ref)), train)
    hyp = Path(a.hyp).read_text("utf-8").splitlines() if a.hyp else None
    print("| test_general part | sentences |" + (" chrF (95% CI) |" if hyp else ""))
    print("|---|---:|" + ("---:|" if hyp else ""))
    for phrase in (False, True):
        for sibling in (False, True):
            idx = [i for i in range(len(src)) if is_phrase(src[i]) == phrase and flags[i] == sibling]
            name = f"{'phrases' if phrase else 'sentences'}, {'siblings' if sibling else 'no siblings'} in train"
            chrf = ""
            if hyp and idx:
                part = score([hyp[i] for i in idx], [ref[i] for i in idx])
                chrf = f" {part['chrf']:.2f} ±{part['chrf_ci95']:.2f} |"
            print(f"| {name} | {len(idx)} |{chrf}")


if __name__ == "__main__":
    main()
