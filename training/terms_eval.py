"""`nmt eval-terms`: how well a model follows a glossary and a do-not-translate list, on test sets
built from held-out units.

    nmt eval-terms --model checkpoints/en-de --data /work/data/corpus-v5b --cache /work/cache \\
        --out checkpoints/en-de/terms_eval.json

Either direction of English and German (the model's metadata says which). The glossary set:
held-out sentences (test_sw, test_general) whose reference holds a Ding dictionary term (a 1-3
word gloss, its source-language side in the source) that the model, translating alone, does not
write; each sentence's glossary is that one entry. The do-not-translate sets: held-out
sentences with a word that the reference copies as written (names: LibreOffice, GIMP, ...), and the
same sentences with an ordinary lower-case word of the source marked do-not-translate (a product
name that is also an English word).

Reported: required terms in the translation, exactly and lemma-aware (the term's stem, the
target language's common endings off, starting a word of the translation); do-not-translate terms kept byte for byte; chrF
of the glossary set with and without the glossary; sentences/s with and without.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from model.terms import INFLECTION_ENDINGS, Terminology, term_used
from model.translator import Translator
from training.corpus import DING_FILE, DING_PACKAGE, parse_ding_line, read_lines
from training.evaluate import score

SETS = ("test_sw", "test_general")
# per language: endings a lemma-aware match takes off, and words too common to be a term
ENDINGS = {"de": INFLECTION_ENDINGS, "en": ("ing", "es", "ed", "e", "s")}
STOPWORDS = {
    "en": {"the", "a", "an", "to", "of", "and", "or", "in", "on", "at", "is", "be", "it", "for", "with", "as", "by",
           "sb.", "sth.", "not", "no", "i", "you", "he", "she", "we", "they", "this", "that"},
    "de": {"der", "die", "das", "den", "dem", "des", "ein", "eine", "einen", "einem", "einer", "und", "oder", "in",
           "im", "an", "am", "auf", "zu", "zum", "zur", "von", "vom", "mit", "für", "ist", "sein", "es", "nicht",
           "kein", "ich", "du", "er", "sie", "wir", "ihr", "man", "dies", "diese", "dieser", "jdn.", "jdm.",
           "etw.", "sich"},
}


def words(text: str) -> list[str]:
    return re.findall(r"\w[\w'-]*", text)


def has_term(text: str, term: str, case: bool = True) -> bool:
    flags = 0 if case else re.IGNORECASE
    return re.search(rf"(?<!\w){re.escape(term)}(?!\w)", text, flags) is not None


def lemma_match(text: str, term: str, lang: str = "de") -> bool:
    """The term in any inflected form: each of its words' stems (the endings of `lang` off)
    starts a word of the text."""
    def stem(word: str) -> str:
        for ending in ENDINGS[lang]:
            if word.endswith(ending) and len(word) - len(ending) >= 3:
                return word[:-len(ending)]
        return word

    found = [w.lower() for w in words(text)]
    return all(any(f.startswith(stem(w).lower()) for f in found) for w in words(term))


def ding_glosses(cache: Path) -> list[tuple[str, str]]:
    """(English, German) word and phrase glosses of the Ding dictionary, 1-3 words each side."""
    found = sorted(cache.glob(f"extract/{DING_PACKAGE}_*/{DING_FILE}"))
    if not found:
        raise SystemExit(f"no Ding dictionary under {cache}/extract: run `nmt corpus --cache {cache}` first")
    pairs = set()
    for line in found[-1].read_text("utf-8", "replace").splitlines():
        for en, de in parse_ding_line(line):
            if 1 <= len(en.split()) <= 3 and 1 <= len(de.split()) <= 3 and en.lower() not in STOPWORDS["en"] \
                    and len(en) >= 3 and re.fullmatch(r"[\w' -]+", en) and re.fullmatch(r"[\w' -]+", de):
                pairs.add((en, de))
    return sorted(pairs)


def glossary_candidates(sources: list[str], references: list[str], glosses: list[tuple[str, str]]):
    """Per sentence, the longest gloss (source term, target term) whose source term is in the
    source (any case) and target term in the reference (as written)."""
    by_word: dict[str, list[tuple[str, str]]] = {}
    for term, target in glosses:
        by_word.setdefault(term.split()[0].lower(), []).append((term, target))
    out = []
    for i, (src, ref) in enumerate(zip(sources, references)):
        options = [(term, target) for w in {w.lower() for w in words(src)} for term, target in by_word.get(w, [])
                   if has_term(src, term, case=False) and has_term(ref, target)]
        if options:
            out.append((i, max(options, key=lambda p: (len(p[0]), p))))
    return out


def translate(translator: Translator, texts: list[str], beam: int, terms: list[Terminology] | None = None,
              term_method: str = "auto"):
    """Best translations (one terminology per text, all in one call, batched as the service
    batches requests) and the seconds it took."""
    start = time.perf_counter()
    results = translator.translate(texts, beam_size=beam, terms=terms, term_method=term_method)
    return [r.hypotheses[0].text for r in results], time.perf_counter() - start


def evaluate(model: str, data: str, cache: str, beam: int = 4, limit: int = 400, threads: int = 2,
             dtype: str = "auto", seed: int = 0, no_sentinels: bool = False, term_method: str = "auto") -> dict:
    """no_sentinels: the model run as one without sentinel pieces (an imported model): terms
    taken out and put back by the attention (protect.take_out, place). term_method: as
    Translator.translate's."""
    torch.set_num_threads(threads)
    translator = Translator.load(model, device="cpu", dtype=dtype)
    if no_sentinels:
        translator.tokenizer.has_sentinels = False
    src_lang, tgt_lang = translator.metadata.get("source_lang", "en"), translator.metadata.get("target_lang", "de")
    if {src_lang, tgt_lang} != {"en", "de"}:
        raise SystemExit(f"eval-terms takes its glossary from an English-German dictionary: an en-de or de-en "
                         f"model, not {src_lang}-{tgt_lang}")
    glosses = ding_glosses(Path(cache))
    if src_lang == "de":
        glosses = [(de, en) for en, de in glosses if de.lower() not in STOPWORDS["de"] and len(de) >= 3]
    sources, references = [], []
    for name in SETS:
        sources += read_lines(Path(data) / f"{name}.{src_lang}")
        references += read_lines(Path(data) / f"{name}.{tgt_lang}")
    candidates = glossary_candidates(sources, references, glosses)
    plain, _ = translate(translator, [sources[i] for i, _ in candidates], beam)
    missing = [(i, pair) for (i, pair), hyp in zip(candidates, plain) if not has_term(hyp, pair[1])]
    rng = random.Random(seed)
    rng.shuffle(missing)
    chosen = sorted(missing[:limit])
    src = [sources[i] for i, _ in chosen]
    ref = [references[i] for i, _ in chosen]
    terms = [Terminology({term: target}) for _, (term, target) in chosen]
    # timed side by side five times, the median of each pair's ratio: this machine drifts
    seconds_without, seconds_with = [], []
    for _ in range(5):
        without, seconds = translate(translator, src, beam)
        seconds_without.append(seconds)
        with_terms, seconds = translate(translator, src, beam, terms, term_method)
        seconds_with.append(seconds)
    ratio = statistics.median(b / a for a, b in zip(seconds_without, seconds_with))
    again = None
    if translator.reads_annotations and term_method == "auto":  # how many went twice
        first = translator.translate(src, beam_size=beam, n_best=beam, terms=terms, term_method="annotate")
        again = sum(not any(term_used(h.text, t) for h in r.hypotheses) for r, (_, (_, t)) in zip(first, chosen))
    exact = sum(has_term(h, t) for h, (_, (_, t)) in zip(with_terms, chosen))
    lemma = sum(lemma_match(h, t, tgt_lang) for h, (_, (_, t)) in zip(with_terms, chosen))
    alone_lemma = sum(lemma_match(h, t, tgt_lang) for h, (_, (_, t)) in zip(without, chosen))
    chrf_without, chrf_with = score(without, ref)["chrf"], score(with_terms, ref)["chrf"]

    # do-not-translate: names the reference copies, and ordinary words marked as names
    names, ordinary = [], []
    for s, r in zip(sources, references):
        copied = [w for w in words(s)[1:] if w[:1].isupper() and len(w) >= 3 and has_term(r, w) and w.lower() not in
                  STOPWORDS[src_lang]]
        if copied:
            names.append((s, copied[0]))
        common = [w for w in words(s) if w.islower() and len(w) >= 4 and w not in STOPWORDS[src_lang]]
        if common:
            ordinary.append((s, rng.choice(common)))
    dnt = {}
    for label, items in (("names", names), ("ordinary_words", ordinary)):
        items = rng.sample(items, min(limit, len(items)))
        hyps, _ = translate(translator, [s for s, _ in items], beam, [Terminology({}, [w]) for _, w in items])
        kept = sum(has_term(h, w) for h, (_, w) in zip(hyps, items))
        plain_hyps, _ = translate(translator, [s for s, _ in items], beam)
        alone = sum(has_term(h, w) for h, (_, w) in zip(plain_hyps, items))
        dnt[label] = {"sentences": len(items), "kept_pct": round(100 * kept / max(1, len(items)), 2),
                      "kept_alone_pct": round(100 * alone / max(1, len(items)), 2)}
    return {
        "model": model, "direction": f"{src_lang}-{tgt_lang}",
        "beam": beam, "dtype": translator.dtype, "threads": threads, "no_sentinels": no_sentinels,
        "term_method": term_method, "reads_annotations": translator.reads_annotations,
        "glossary": {
            "candidates": len(candidates), "model_alone_writes_term_pct": round(
                100 * (len(candidates) - len(missing)) / max(1, len(candidates)), 2),
            "sentences": len(chosen), "term_exact_pct": round(100 * exact / max(1, len(chosen)), 2),
            "term_lemma_pct": round(100 * lemma / max(1, len(chosen)), 2),
            "term_lemma_alone_pct": round(100 * alone_lemma / max(1, len(chosen)), 2),
            "chrf_without": chrf_without, "chrf_with": chrf_with,
            "sentences_per_s_without": round(len(src) / statistics.median(seconds_without), 2),
            "sentences_per_s_with": round(len(src) / statistics.median(seconds_with), 2),
            "time_ratio": round(ratio, 3),
            "translated_again": again,
            "examples": [{"source": s, "term": t.glossary, "without": a, "with": b, "reference": r}
                         for s, t, a, b, r in list(zip(src, terms, without, with_terms, ref))[:8]],
        },
        "do_not_translate": dnt,
    }


def markdown(report: dict) -> str:
    g, d = report["glossary"], report["do_not_translate"]
    return "\n".join([
        f"Glossary set: {g['sentences']} held-out sentences (of {g['candidates']} with a Ding term in source and "
        f"reference; the model alone writes the term in {g['model_alone_writes_term_pct']}% of those); glossary "
        f"method {report['term_method']}" + ("" if report["reads_annotations"] else " (the model reads no annotations)"),
        "",
        "| | without glossary | with glossary |", "|---|---:|---:|",
        f"| required term, exact | 0% (by construction) | {g['term_exact_pct']}% |",
        f"| required term, lemma-aware | {g['term_lemma_alone_pct']}% | {g['term_lemma_pct']}% |",
        f"| chrF | {g['chrf_without']} | {g['chrf_with']} |",
        f"| sentences/s (beam {report['beam']}, {report['dtype']}) | {g['sentences_per_s_without']} | "
        f"{g['sentences_per_s_with']} |",
        f"| time with / without (median of 5 side by side) | | {g['time_ratio']:.2f}x |",
        *([f"| translated again (no beam wrote the term) | | {g['translated_again']} |"]
          if g.get("translated_again") is not None else []), "",
        "| do-not-translate set | sentences | kept (with the list) | kept (model alone) |", "|---|---:|---:|---:|",
        *[f"| {name} | {v['sentences']} | {v['kept_pct']}% | {v['kept_alone_pct']}% |" for name, v in d.items()],
    ])


def eval_terms_command(args) -> dict:
    report = evaluate(args.model, args.data, args.cache, args.beam, args.limit, args.threads, args.dtype,
                      no_sentinels=args.no_sentinels, term_method=args.term_method)
    print(markdown(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    return report


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--data", default="data/corpus", help="corpus with test_sw and test_general (.en/.de)")
    p.add_argument("--cache", default="data/cache", help="`nmt corpus`'s cache (the Ding dictionary)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--limit", type=int, default=400, help="sentences per set")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "int8"])
    p.add_argument("--no-sentinels", action="store_true", help="run the model as one without sentinel pieces: "
                   "terms taken out and put back by the attention (how imported models take them)")
    p.add_argument("--term-method", default="auto", choices=["auto", "annotate", "spans"],
                   help="how glossary terms reach the model (Translator.translate's term_method)")
    p.add_argument("--out", help="write the JSON report here")


def register(subparsers) -> None:
    p = subparsers.add_parser("eval-terms", help="glossary and do-not-translate use on held-out sentences")
    add_args(p)
    p.set_defaults(func=eval_terms_command)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m training.terms_eval")
    add_args(parser)
    eval_terms_command(parser.parse_args(sys.argv[1:]))
