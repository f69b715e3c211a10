"""Back-translation (Sennrich et al., 2016): sentences that exist in one language only get a
source written by the model of the other direction, and the pair trains this direction.

The only general-language text in the corpus is Ding's example sentences and the Bible; Debian
also ships fortune cookies, monolingual, in both languages: quotations, proverbs, jokes and
dialogue (`fortunes-de`, `fortunes`), and in English WordNet's usage examples, everyday
sentences such as "the suspect is in custody" (`wordnet-base`). Two steps, because the second
needs a trained model:

    nmt monolingual --data CORPUS --cache CACHE       # CORPUS/mono.de, CORPUS/mono.en
    nmt backtranslate --data CORPUS --model checkpoints/de-en
        # CORPUS/backtranslated.en-de.{en,de}: the German is real, the English the model's

A pair's machine-made side is always its source side: a run of direction en-de reads
`backtranslated.en-de.*` (with `nmt train --back-translated`), so a model never learns to write
synthetic text. A monolingual sentence that matches a held-out sentence of its language (dev or
a test set, compared as corpus.norm_key does) is dropped, so no test reference becomes a target.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from training.corpus import SENT_END, fetch_packages, norm_key, normalize, read_lines, split_sentences

FORTUNE_PACKAGES = {"de": ["fortunes-de"], "en": ["fortunes-min", "fortunes"]}  # -min: the file `fortunes`
FORTUNE_DIRS = {"de": "usr/share/games/fortunes/de", "en": "usr/share/games/fortunes"}
WORDNET_PACKAGE, WORDNET_DIR = "wordnet-base", "usr/share/wordnet"
WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
# pictures, phrase lists with both languages, verse and other layout that is no sentence
SKIPPED_FILES = {"art", "ascii-art", "asciiart", "translate-me", "translations", "ethnic", "songs-poems",
                 "gedichte", "zippy"}
HELDOUT_SETS = ("dev", "test_sw", "test_general", "test_protect")
MIN_WORDS, MAX_WORDS = 4, 40

OVERSTRIKE_RE = re.compile(r".\x08")  # "_\bx": underlined x in nroff output
ATTRIBUTION_RE = re.compile(r"^\s*(--|—)")  # "		-- Mark Twain"
NOT_PROSE_RE = re.compile(r"[|_<>{}\[\]#@\\/=~*^$]|https?:|\d{3,}|\.\.|!!|\?\?|[A-Z]{4,}")
STARTS_RE = re.compile(r"^[\"'„“‚]?[A-ZÄÖÜ]")


def read_cookies(text: str) -> list[str]:
    """A fortune file's cookies (separated by lines holding only '%'), overstrikes removed."""
    text = OVERSTRIKE_RE.sub("", text)
    cookies, lines = [], []
    for line in text.splitlines() + ["%"]:
        if line.strip() == "%":
            if lines:
                cookies.append("\n".join(lines))
            lines = []
        else:
            lines.append(line)
    return cookies


def cookie_sentences(cookie: str) -> list[str]:
    """The prose sentences of one cookie: attribution lines dropped; a cookie laid out in
    indented lines (verse, dialogue, tables) gives none; each sentence 4-40 words, starting
    with a capital and ending in . ! or ?, without markup, digits runs or shouting."""
    lines = [line for line in cookie.splitlines() if line.strip() and not ATTRIBUTION_RE.match(line)]
    if not lines or sum(line[:1].isspace() for line in lines) > len(lines) // 3:
        return []
    text = normalize(" ".join(line.strip() for line in lines))
    return [s for s in split_sentences(text)
            if MIN_WORDS <= len(s.split()) <= MAX_WORDS and s.endswith(SENT_END) and STARTS_RE.match(s)
            and not NOT_PROSE_RE.search(s)]


def fortune_sentences(folders: list[Path]) -> list[tuple[str, str]]:
    """(file name, sentence) of every fortune file in the folders (not the .dat indexes or the
    .u8 links), in file-name order, each sentence once."""
    seen, out = set(), []
    for path in sorted((p for folder in folders for p in folder.iterdir()), key=lambda p: p.name):
        if path.suffix or path.is_symlink() or path.is_dir() or path.name in SKIPPED_FILES:
            continue
        for cookie in read_cookies(path.read_text(encoding="utf-8", errors="replace")):
            for sentence in cookie_sentences(cookie):
                if sentence not in seen and "\ufffd" not in sentence:
                    seen.add(sentence)
                    out.append((path.name, sentence))
    return out


def wordnet_examples(folder: Path) -> list[tuple[str, str]]:
    """("wordnet", sentence) of every usage example in WordNet's synset glosses, each once.

    A data file's synset line ends in its gloss, `| definition; "example"; "example"`; lines
    starting with spaces are the licence. An example of 4-40 words, without markup or digit runs,
    gets a capital first letter and a full stop where it ends without . ! or ?, as the corpus's
    sentences have ("the suspect is in custody" -> "The suspect is in custody.").
    """
    seen, out = set(), []
    for name in WORDNET_FILES:
        for line in (folder / name).read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(" ") or "|" not in line:
                continue
            for example in re.findall(r'"([^"]+)"', line.split("|", 1)[1]):
                sentence = normalize(example)
                if not MIN_WORDS <= len(sentence.split()) <= MAX_WORDS or NOT_PROSE_RE.search(sentence):
                    continue
                sentence = sentence[0].upper() + sentence[1:]
                if not sentence.endswith(SENT_END):
                    sentence += "."
                if sentence not in seen and "\ufffd" not in sentence:
                    seen.add(sentence)
                    out.append(("wordnet", sentence))
    return out


def heldout_keys(corpus: Path, lang: str) -> set[str]:
    return {norm_key(line) for name in HELDOUT_SETS if (corpus / f"{name}.{lang}").exists()
            for line in read_lines(corpus / f"{name}.{lang}")}


def build_monolingual(corpus: Path, cache: Path, folders: dict[str, list[Path]] | None = None,
                      wordnet: Path | None = None) -> dict:
    """Write corpus/mono.{de,en} (and mono.{de,en}.source: the fortune file of each line, or
    `wordnet`) from the fortune packages and WordNet, or from `folders` (language -> directories
    of fortune files) and `wordnet` (WordNet's data folder, English); return the counts per
    language."""
    if folders is None:
        packages = [pkg for pkgs in FORTUNE_PACKAGES.values() for pkg in pkgs] + [WORDNET_PACKAGE]
        unpacked = fetch_packages(packages, cache, folder="mono")
        folders = {lang: [unpacked[pkg] / FORTUNE_DIRS[lang] for pkg in pkgs] for lang, pkgs in FORTUNE_PACKAGES.items()}
        wordnet = unpacked[WORDNET_PACKAGE] / WORDNET_DIR
    stats = {}
    for lang, dirs in folders.items():
        found = fortune_sentences(dirs)
        if lang == "en" and wordnet is not None:
            in_fortunes = {s for _, s in found}
            found += [(name, s) for name, s in wordnet_examples(wordnet) if s not in in_fortunes]
        held = heldout_keys(corpus, lang)
        kept = [(name, s) for name, s in found if norm_key(s) not in held]
        (corpus / f"mono.{lang}").write_text("".join(s + "\n" for _, s in kept), encoding="utf-8")
        (corpus / f"mono.{lang}.source").write_text("".join(name + "\n" for name, _ in kept), encoding="utf-8")
        stats[lang] = {"sentences": len(found), "dropped_heldout": len(found) - len(kept), "kept": len(kept)}
        if lang == "en" and wordnet is not None:
            stats[lang]["wordnet_kept"] = sum(name == "wordnet" for name, _ in kept)
    (corpus / "mono.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def backtranslated_files(corpus: Path, direction: str) -> tuple[Path, Path]:
    """The (English, German) files of the synthetic pairs that train `direction`."""
    return corpus / f"backtranslated.{direction}.en", corpus / f"backtranslated.{direction}.de"


def backtranslate(corpus: Path, model_dir: Path, beam_size: int = 4, dtype: str = "auto",
                  batch_tokens: int = 4096) -> dict:
    """Translate corpus/mono.<model's source> with the model; write the pairs for the opposite
    direction (their source side the model's output); return counts."""
    from model.translator import Translator

    meta = json.loads((model_dir / "metadata.json").read_text())
    lang_from, lang_to = meta["source_lang"], meta["target_lang"]
    real = read_lines(corpus / f"mono.{lang_from}")
    translator = Translator.load(str(model_dir), device="cpu", dtype=dtype)
    results = translator.translate(real, beam_size=beam_size, batch_tokens=batch_tokens)
    synthetic = [normalize(r.hypotheses[0].text) for r in results]
    kept = [(r, s) for r, s in zip(real, synthetic) if s and "\n" not in s]
    direction = f"{lang_to}-{lang_from}"  # the synthetic side is the source side
    files = dict(zip(("en", "de"), backtranslated_files(corpus, direction)))
    files[lang_from].write_text("".join(r + "\n" for r, _ in kept), encoding="utf-8")
    files[lang_to].write_text("".join(s + "\n" for _, s in kept), encoding="utf-8")
    return {"direction": direction, "monolingual": len(real), "pairs": len(kept)}


def _monolingual_cli(args: argparse.Namespace) -> None:
    print(json.dumps(build_monolingual(Path(args.data), Path(args.cache)), indent=2))


def _backtranslate_cli(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    print(json.dumps(backtranslate(Path(args.data), Path(args.model), args.beams, args.dtype), indent=2))


def register(subparsers) -> None:
    p = subparsers.add_parser("monolingual", help="write a corpus's monolingual sentences (mono.de, mono.en) "
                              "from Debian's fortune packages and WordNet, held-out sentences dropped")
    p.add_argument("--data", required=True, help="corpus directory (`nmt corpus --out`)")
    p.add_argument("--cache", default="data/cache", help="download/extraction cache")
    p.set_defaults(func=_monolingual_cli)
    p = subparsers.add_parser("backtranslate", help="translate a corpus's mono.<source> with a model: synthetic "
                              "pairs for the opposite direction (backtranslated.<direction>.*)")
    p.add_argument("--data", required=True, help="corpus directory holding mono.de / mono.en")
    p.add_argument("--model", required=True, help="checkpoint directory of the reverse model")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=_backtranslate_cli)
