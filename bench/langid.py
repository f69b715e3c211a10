"""Language detectors on short and long text, measured side by side: which one /detect should use.

Samples come from the gettext catalogs of Debian packages in the corpus cache (`nmt corpus
--cache`): each translated msgstr is a text in its catalog's language, each msgid one in English.
A short text has 1-3 words (menu labels, buttons: what Weblate and chat clients send), a long one
8 words or more. Placeholders, tags and URLs (model/protect.py) are cut out first, and a msgstr
equal to its msgid (left untranslated) is skipped.

    .venv/bin/python bench/langid.py --cache /work/cache [--packages 120] [--per-bucket 150]

Prints, per detector, the accuracy on short and long text over all languages (and the worst
languages), the median microseconds per text, and the resident memory its models took.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.protect import SPAN_RE  # noqa: E402
from training.corpus import catalog_packages, read_mo  # noqa: E402

LANGUAGES = ["ca", "cs", "da", "de", "el", "en", "es", "et", "fi", "fr", "hu", "it", "ja", "ko", "lt", "nl", "pl",
             "pt", "ro", "ru", "sk", "sv", "tr", "uk", "zh"]
CATALOG_DIRS = {"zh": "zh_CN", "pt": "pt"}  # the catalog directory holding a language's text


def extract(debs: list[Path], dest: Path) -> None:
    wanted = {f"/{CATALOG_DIRS.get(code, code)}/LC_MESSAGES/" for code in LANGUAGES if code != "en"}
    for deb in debs:
        with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as proc, \
                tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".mo") and any(w in member.name for w in wanted):
                    target = dest / deb.stem / member.name.removeprefix("./")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(member).read())


def words(text: str) -> int:
    return len(text.split()) if not any("\u3000" <= c <= "\u9fff" or "\uac00" <= c <= "\ud7af" for c in text) \
        else max(1, len(text) // 3)  # CJK: about three characters a word


def samples(root: Path, per_bucket: int, seed: int = 1) -> dict[tuple[str, str], list[str]]:
    """(language, 'short' | 'long') -> texts."""
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.mo")):
        directory = path.parent.parent.name
        code = next((c for c in LANGUAGES if CATALOG_DIRS.get(c, c) == directory), None)
        if code is None:
            continue
        for msgid, msgstr in read_mo(path):
            for language, text in (("en", msgid), (code, msgstr)):
                if language != "en" and (not msgstr or msgstr == msgid):
                    continue
                text = " ".join(SPAN_RE.sub(" ", text.replace("&", "").replace("_", "")).split())
                if not any(c.isalpha() for c in text):
                    continue
                n = words(text)
                if 1 <= n <= 3 and len(text) <= 30:
                    found[(language, "short")].add(text)
                elif n >= 8:
                    found[(language, "long")].add(text)
    rng = random.Random(seed)
    return {key: rng.sample(sorted(texts), min(per_bucket, len(texts))) for key, texts in sorted(found.items())}


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def lingua_detector(low_accuracy: bool):
    from lingua import LanguageDetectorBuilder

    builder = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models()
    detector = (builder.with_low_accuracy_mode() if low_accuracy else builder).build()

    def detect(text: str) -> str | None:
        found = detector.detect_language_of(text)
        return found.iso_code_639_1.name.lower() if found else None

    return detect


def cld2_detector():
    import pycld2

    def detect(text: str) -> str | None:
        try:
            _, _, choices = pycld2.detect(text, bestEffort=True)
        except pycld2.error:
            return None
        code = choices[0][1]
        return None if code == "un" else code.split("-")[0]

    return detect


def libretranslate_detector():
    """LibreTranslate's (libretranslate/detect.py, 1.9): cld2's and lingua's candidates, the one
    with the highest confidence wins."""
    import pycld2
    from lingua import LanguageDetectorBuilder

    lingua = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models().build()

    def detect(text: str) -> str | None:
        candidates = []
        try:
            _, _, choices = pycld2.detect(text, bestEffort=True)
            candidates += [(float(percent), code.split("-")[0]) for _, code, percent, _ in choices if code != "un"]
        except pycld2.error:
            pass
        candidates += [(value.value * 100, value.language.iso_code_639_1.name.lower())
                       for value in lingua.compute_language_confidence_values(text)[:3]]
        return max(candidates)[1] if candidates else None

    return detect


def langdetect_detector():
    from langdetect import DetectorFactory, LangDetectException
    from langdetect import detect as langdetect

    DetectorFactory.seed = 0

    def detect(text: str) -> str | None:
        try:
            return langdetect(text).split("-")[0]
        except LangDetectException:
            return None

    return detect


DETECTORS = {"lingua (high accuracy)": lambda: lingua_detector(False),
             "lingua (low accuracy)": lambda: lingua_detector(True),
             "cld2": cld2_detector,
             "LibreTranslate (cld2 + lingua)": libretranslate_detector,
             "langdetect": langdetect_detector}


def measure(name: str, data: dict[tuple[str, str], list[str]]) -> str:
    """One table row (run in a process of its own, so its memory is its own)."""
    before = rss_mb()
    detect = DETECTORS[name]()
    detect("warm up")
    memory = rss_mb() - before
    correct: dict[str, list[bool]] = defaultdict(list)
    per_language: dict[str, list[bool]] = defaultdict(list)
    times = []
    for (language, length), texts in data.items():
        for text in texts:
            start = time.perf_counter()
            guess = detect(text)
            times.append(time.perf_counter() - start)
            correct[length].append(guess == language)
            if length == "short":
                per_language[language].append(guess == language)
    worst = sorted(per_language, key=lambda lang: statistics.mean(per_language[lang]))[:3]
    share = {k: 100 * statistics.mean(v) for k, v in correct.items()}
    return (f"| {name} | {share['short']:.1f}% | {share['long']:.1f}% | "
            + ", ".join(f"{lang} {100 * statistics.mean(per_language[lang]):.0f}%" for lang in worst)
            + f" | {1e6 * statistics.median(times):.0f} | {memory:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path("/work/cache"), help="nmt corpus --cache directory")
    parser.add_argument("--packages", type=int, default=120, help="catalog packages to read (the first, by name)")
    parser.add_argument("--per-bucket", type=int, default=150, help="texts per language and length")
    parser.add_argument("--detectors", default=",".join(DETECTORS), help="comma-separated subset of the detectors")
    parser.add_argument("--samples", type=Path, help=argparse.SUPPRESS)  # a child process: measure one detector
    args = parser.parse_args()
    if args.samples:
        data = {tuple(key.split("/")): texts for key, texts in json.loads(args.samples.read_text()).items()}
        print(measure(args.detectors, data), flush=True)
        return

    names = set(catalog_packages())
    debs = sorted(d for d in (args.cache / "debs").glob("*.deb") if d.name.split("_")[0] in names)[:args.packages]
    with tempfile.TemporaryDirectory() as tmp:
        extract(debs, Path(tmp))
        data = samples(Path(tmp), args.per_bucket)
        languages = sorted({language for language, _ in data})
        print(f"{len(debs)} packages; {len(languages)} languages; texts per language (short/long): "
              + ", ".join(f"{lang} {len(data.get((lang, 'short'), []))}/{len(data.get((lang, 'long'), []))}"
                          for lang in languages))
        print()
        print("| detector | short texts correct | long texts correct | worst short | us/text (median) | memory MB |")
        print("|---|---|---|---|---|---|", flush=True)
        path = Path(tmp) / "samples.json"
        path.write_text(json.dumps({f"{lang}/{length}": texts for (lang, length), texts in data.items()}))
        for name in args.detectors.split(","):
            subprocess.run([sys.executable, __file__, "--samples", str(path), "--detectors", name], check=True)


if __name__ == "__main__":
    main()
