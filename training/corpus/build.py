"""The pipeline: every source extracted, cleaned, deduplicated, split and written; the `nmt corpus` command."""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from training.corpus.bible import extract_bible, fetch_bible, modernize_spelling
from training.corpus.common import (
    ALL_SOURCES,
    CATALOG_MEMBER_RE,
    DEV_SIZE,
    DING_PACKAGES,
    GETTEXT_PACKAGES,
    LICENCES,
    LOHELP_PACKAGES,
    MALLARD_PACKAGES,
    SEED,
    SENT_END,
    STORIES_MEMBER_RE,
    STORIES_PACKAGES,
    TEST_GENERAL_SIZE,
    TEST_PROTECT_SIZE,
    TEST_SW_SIZE,
    catalog_packages,
    clean_pair,
    fetch_packages,
    is_sentence_like,
    package_list,
)
from training.corpus.ddtp import extract_ddtp
from training.corpus.ding import extract_ding
from training.corpus.docs import DOCS_PACKAGES, extract_docs
from training.corpus.gettext import extract_catalogs, extract_gettext
from training.corpus.kdehelp import KDEHELP_LIST, KDEHELP_MEMBER_RE, extract_kdehelp
from training.corpus.lohelp import extract_lohelp
from training.corpus.mallard import GNOMEHELP_LIST, GNOMEHELP_MEMBER_RE, extract_mallard
from training.corpus.manpages import MANPAGE_LIST, MANPAGE_MEMBER_RE, extract_manpages
from training.corpus.mozilla import MOZILLA_MEMBER_RE, MOZILLA_PACKAGES, extract_mozilla
from training.corpus.qtcatalogs import QT_LIST, QT_MEMBER_RE, extract_qtcatalogs
from training.corpus.split import dedup_against, drop_ding_lines, heldout_ok, pick_general_test, pick_protect_test, split_by_unit
from training.corpus.stories import extract_stories


def dedup(pairs: list[dict]) -> tuple[list[dict], Counter, Counter]:
    """Exact dedup on (en, de), then on en (first wins); return kept and drop counts."""
    seen_pair: set[tuple[str, str]] = set()
    seen_en: set[str] = set()
    kept, d_pair, d_en = [], Counter(), Counter()
    for p in pairs:
        key = (p["en"], p["de"])
        if key in seen_pair:
            d_pair[p["source"]] += 1
            continue
        seen_pair.add(key)
        if p["en"] in seen_en:
            d_en[p["source"]] += 1
            continue
        seen_en.add(p["en"])
        kept.append(p)
    return kept, d_pair, d_en


def raw_pairs(sources: list[str], cache_dir: Path) -> Iterator[tuple[str, str, str, str]]:
    """Yield (source, unit, en, de) for the requested sources, in a fixed order."""
    names: list[str] = []
    if "gettext" in sources:
        names += GETTEXT_PACKAGES
    if "lohelp" in sources:
        names += LOHELP_PACKAGES
    if "mallard" in sources:
        names += MALLARD_PACKAGES
    if "ding" in sources:
        names += DING_PACKAGES
    pkgs = fetch_packages(list(dict.fromkeys(names)), cache_dir) if names else {}
    catalogs = (fetch_packages(catalog_packages(), cache_dir, only=CATALOG_MEMBER_RE, folder="catalogs")
                if "catalogs" in sources else {})
    manpages = (fetch_packages(["manpages-de", *package_list(MANPAGE_LIST)], cache_dir, only=MANPAGE_MEMBER_RE,
                               folder="manpages") if "manpages" in sources else {})
    mozilla = (fetch_packages([*MOZILLA_PACKAGES, *MOZILLA_PACKAGES.values()], cache_dir, only=MOZILLA_MEMBER_RE,
                              folder="mozilla") if "mozilla" in sources else {})
    qtcatalogs = (fetch_packages(package_list(QT_LIST), cache_dir, only=QT_MEMBER_RE, folder="qtcatalogs")
                  if "qtcatalogs" in sources else {})
    gnomehelp = (fetch_packages(package_list(GNOMEHELP_LIST), cache_dir, only=GNOMEHELP_MEMBER_RE, folder="gnomehelp")
                 if "gnomehelp" in sources else {})
    kdehelp = (fetch_packages(package_list(KDEHELP_LIST), cache_dir, only=KDEHELP_MEMBER_RE, folder="kdehelp")
               if "kdehelp" in sources else {})
    docs = fetch_packages(DOCS_PACKAGES, cache_dir, folder="extract") if "docs" in sources else {}
    stories = (fetch_packages(STORIES_PACKAGES, cache_dir, only=STORIES_MEMBER_RE, folder="stories")
               if "stories" in sources else {})
    def manpage_pairs():
        german = manpages.pop("manpages-de")
        return extract_manpages(german, manpages)

    extractors = {  # source -> its (unit, en, de) rows, read when its turn comes
        "gettext": lambda: extract_gettext(pkgs), "ddtp": lambda: extract_ddtp(cache_dir),
        "lohelp": lambda: extract_lohelp(pkgs),
        "mallard": lambda: extract_mallard({n: pkgs[n] for n in MALLARD_PACKAGES}),
        "gnomehelp": lambda: extract_mallard(gnomehelp), "catalogs": lambda: extract_catalogs(catalogs),
        "bible": lambda: extract_bible(fetch_bible(cache_dir)), "stories": lambda: extract_stories(stories),
        "docs": lambda: extract_docs(docs), "kdehelp": lambda: extract_kdehelp(kdehelp),
        "mozilla": lambda: extract_mozilla(mozilla), "qtcatalogs": lambda: extract_qtcatalogs(qtcatalogs),
        "manpages": manpage_pairs,
    }
    for src in ALL_SOURCES:
        if src not in sources:
            continue
        if src == "ding":  # tags its own rows: example sentences and dictionary entries apart
            yield from extract_ding(pkgs)
        else:
            yield from ((src, unit, en, de) for unit, en, de in extractors[src]())


def read_lines(path: Path) -> list[str]:
    """A file of one segment a line, as write_split writes it (only \\n ends a line: a stray \\r
    inside a segment must not split it)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def write_split(out_dir: Path, name: str, pairs: list[dict], with_source: bool = False) -> None:
    """Write ``name.en``/``name.de`` (and ``name.source``), one segment per line."""
    def clean(s: str) -> str:
        return s.replace("\t", " ").replace("\n", " ").replace("\r", " ")
    with open(out_dir / f"{name}.en", "w", encoding="utf-8") as fe, \
            open(out_dir / f"{name}.de", "w", encoding="utf-8") as fd:
        for p in pairs:
            fe.write(clean(p["en"]) + "\n")
            fd.write(clean(p["de"]) + "\n")
    if with_source:
        with open(out_dir / f"{name}.source", "w", encoding="utf-8") as fs:
            for p in pairs:
                fs.write(p["source"] + "\n")


FILTERS = ["empty", "markup", "placeholder", "length", "ratio", "identical"]


def build(out_dir: Path, cache_dir: Path, sources: list[str] | None = None) -> dict:
    """Download, extract, clean, dedup, split and write the corpus; return the stats."""
    t0 = time.time()
    out_dir, cache_dir = Path(out_dir), Path(cache_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = list(sources or ALL_SOURCES)
    unknown = set(sources) - set(ALL_SOURCES)
    if unknown:
        raise ValueError(f"unknown sources: {sorted(unknown)}")

    raw, dropped = Counter(), Counter()
    cleaned: list[dict] = []
    for src, unit, en, de in raw_pairs(sources, cache_dir):
        raw[src] += 1
        ce, cd, why = clean_pair(en, de)
        if why != "ok":
            dropped[(src, why)] += 1
            continue
        cleaned.append({"source": src, "unit": unit, "en": ce, "de": cd})
    after_clean = Counter(p["source"] for p in cleaned)
    modernize_spelling(cleaned)
    # Ding example sentences go first so dedup on en keeps them for test_general.
    order = {s: i for i, s in enumerate(["ding"] + ALL_SOURCES + ["ding_dict"])}
    cleaned.sort(key=lambda p: order[p["source"]])  # stable: unit order kept within source
    kept, d_pair, d_en = dedup(cleaned)

    general = pick_general_test(kept, TEST_GENERAL_SIZE)
    rest, d_sibling = drop_ding_lines(kept, general)

    sw = [s for s in ["gettext", "ddtp", "lohelp", "mallard"] if s in sources]
    weights = {s: sum(1 for p in rest if p["source"] == s and heldout_ok(p["en"])
                      and p["en"].endswith(SENT_END)) for s in sw}
    total = sum(weights.values()) or 1
    quotas = {s: (round(DEV_SIZE * w / total), round(TEST_SW_SIZE * w / total))
              for s, w in weights.items()}
    train, dev, test = split_by_unit(rest, quotas)
    train = dedup_against(train, general)
    train, test_protect = pick_protect_test(train, TEST_PROTECT_SIZE) if "catalogs" in sources else (train, [])
    random.Random(SEED).shuffle(train)  # sources interleaved for the trainer

    write_split(out_dir, "train", train, with_source=True)
    write_split(out_dir, "dev", dev)
    write_split(out_dir, "test_sw", test)
    write_split(out_dir, "test_general", general)
    write_split(out_dir, "test_protect", test_protect)

    all_src = [s for s in ALL_SOURCES + ["ding_dict"] if raw[s]]
    table = {}
    for s in all_src:
        row = {"raw": raw[s]}
        for f in FILTERS:
            row[f"drop_{f}"] = dropped[(s, f)]
        row["clean"] = after_clean[s]
        row["drop_dup_pair"] = d_pair[s]
        row["drop_dup_en"] = d_en[s]
        row["unique"] = row["clean"] - d_pair[s] - d_en[s]
        row["drop_test_line"] = d_sibling[s]
        row["train"] = sum(p["source"] == s for p in train)
        row["train_sentence_like"] = sum(p["source"] == s and is_sentence_like(p["en"]) for p in train)
        row["dev"] = sum(p["source"] == s for p in dev)
        row["test_sw"] = sum(p["source"] == s for p in test)
        row["test_general"] = sum(p["source"] == s for p in general)
        row["test_protect"] = sum(p["source"] == s for p in test_protect)
        table[s] = row
    stats = {
        "sources": table,
        "splits": {"train": len(train), "dev": len(dev), "test_sw": len(test),
                   "test_general": len(general), "test_protect": len(test_protect)},
        "train_sentence_like": sum(is_sentence_like(p["en"]) for p in train),
        "quotas": quotas,
        "seed": SEED,
        "seconds": round(time.time() - t0, 1),
    }
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    (out_dir / "stats.md").write_text(stats_markdown(stats))
    print(stats_markdown(stats))
    return stats


def stats_markdown(stats: dict) -> str:
    """Render the per-source filter table, split sizes and licences as Markdown."""
    cols = ["raw"] + [f"drop_{f}" for f in FILTERS] + ["clean", "drop_dup_pair", "drop_dup_en",
            "unique", "drop_test_line", "train", "train_sentence_like", "dev", "test_sw", "test_general", "test_protect"]
    lines = ["# en-de corpus statistics", "",
             "Pairs per source before/after each filter (drops are applied in column order).", "",
             "| source | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    tot = Counter()
    for s, row in stats["sources"].items():
        lines.append(f"| {s} | " + " | ".join(str(row[c]) for c in cols) + " |")
        tot.update({c: row[c] for c in cols})
    lines.append("| **total** | " + " | ".join(str(tot[c]) for c in cols) + " |")
    lines += ["", "## Splits", "", "| split | pairs |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in stats["splits"].items()]
    lines += ["", f"Sentence-like train pairs (English 4-60 words, ends in . ! ?, no placeholder): "
              f"{stats['train_sentence_like']}", "",
              "Domain: software UI strings and documentation (plus dictionary examples); "
              "report quality with that caveat.", "", "## Licences", "",
              "| source | licence |", "|---|---|"]
    lines += [f"| {s} | {LICENCES[s]} |" for s in stats["sources"]]
    return "\n".join(lines) + "\n"


def _run_cli(args: argparse.Namespace) -> None:
    srcs = [s.strip() for s in args.sources.split(",") if s.strip()] if args.sources else None
    build(Path(args.out), Path(args.cache), srcs)


def register(subparsers) -> None:
    """Add the ``corpus`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("corpus", help="build the en-de training corpus from Debian packages")
    p.add_argument("--out", default="data/corpus", help="output directory")
    p.add_argument("--cache", default="data/cache", help="download/extraction cache")
    p.add_argument("--sources", default=None,
                   help=f"comma list of sources (default: all of {','.join(ALL_SOURCES)})")
    p.set_defaults(func=_run_cli)
