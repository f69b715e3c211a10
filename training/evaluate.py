"""`nmt eval`: sacreBLEU BLEU and chrF of a checkpoint on the test sets, per beam size.

    python -m training.evaluate --model data/runs/en-de/final --data data/corpus \
        --sets test_sw,test_general --beams 1,4 --out eval.json

Scores are deterministic (fixed thread count, deterministic search); only sentences/s varies.
Hypotheses are detokenized SentencePiece output scored against the raw references with
sacreBLEU's default 13a tokenization; the signatures are printed and stored.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from model import protect
from model.results import TranslationResult
from model.translator import Translator
from training.corpus import read_lines

BOOTSTRAP_SAMPLES = 1000


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF, each with the half-width of its 95% confidence interval: sacreBLEU's
    bootstrap resampling of the sentences (1,000 samples, its fixed seed), so that two scores can
    be told apart from the noise of which sentences a test set happens to hold."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, [references], n_bootstrap=BOOTSTRAP_SAMPLES)
    c = chrf.corpus_score(hypotheses, [references], n_bootstrap=BOOTSTRAP_SAMPLES)
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2),
            "bleu_ci95": round(float(b._ci), 2), "chrf_ci95": round(float(c._ci), 2),
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
            "bleu_detail": str(b)}


def span_scores(sources: list[str], results: list[TranslationResult]) -> dict | None:
    """For sources with protected spans (placeholders, tags, URLs; model/protect.py): the share of
    spans, and of sentences with all their spans, that the best hypothesis holds exactly (as many
    times as the source), as returned (after the repair) and as the model wrote them (before it:
    a repaired hypothesis counts as wrong). None when no source has a span."""
    spans = [Counter(protect.spans(s)) for s in sources]
    total = sum(sum(c.values()) for c in spans)
    if not total:
        return None
    kept = {"returned": [0, 0], "model": [0, 0]}  # spans right, sentences all right
    sentences = 0
    for wanted, result in zip(spans, results):
        if not wanted:
            continue
        sentences += 1
        best = result.hypotheses[0]
        found = Counter(protect.spans(best.text))
        right = sum(min(n, found[span]) for span, n in wanted.items())
        exact = all(found[span] == n for span, n in wanted.items())
        for kind, ok in (("returned", True), ("model", not best.repaired)):
            kept[kind][0] += right if ok else 0
            kept[kind][1] += exact and ok
    return {"sentences_with_spans": sentences, "spans": total,
            **{f"spans_{kind}": round(100 * r / total, 2) for kind, (r, _) in kept.items()},
            **{f"sentences_{kind}": round(100 * s / sentences, 2) for kind, (_, s) in kept.items()}}


def neighbours(text: str) -> list[tuple[str, str, str]]:
    """Each protected span of a text with the words on either side of it ("" at the ends)."""
    out = []
    for a, b in protect.find_spans(text):
        left, right = re.findall(r"\w+", text[:a]), re.findall(r"\w+", text[b:])
        out.append((text[a:b], left[-1] if left else "", right[0] if right else ""))
    return out


def placement(hypotheses: list[str], references: list[str]) -> dict | None:
    """Spans placed as in the reference: the same words on both sides of the span (the k-th
    occurrence of a span text matched with the k-th); None when no reference has a span."""
    total = placed = 0
    for hyp, ref in zip(hypotheses, references):
        wanted = neighbours(ref)
        found: dict[str, list[tuple[str, str]]] = {}
        for span, left, right in neighbours(hyp):
            found.setdefault(span, []).append((left, right))
        for span, left, right in wanted:
            total += 1
            options = found.get(span, [])
            if options:
                placed += options.pop(0) == (left, right)
    return {"spans": total, "placed_as_reference": round(100 * placed / total, 2)} if total else None


def evaluate_set(translator: Translator, sources: list[str], references: list[str], beam: int,
                 batch_tokens: int, length_penalty: float | None = None) -> tuple[dict, list[str]]:
    start = time.perf_counter()
    results = translator.translate(sources, beam_size=beam, batch_tokens=batch_tokens, length_penalty=length_penalty)
    seconds = time.perf_counter() - start
    hyps = [r.hypotheses[0].text for r in results]
    row = {"beam": beam, "sentences": len(sources), **score(hyps, references),
           "seconds": round(seconds, 2), "sentences_per_s": round(len(sources) / seconds, 2)}
    spans = span_scores(sources, results)
    if spans:
        row["protected_spans"] = spans
        row["protected_spans"].update(placement(hyps, references) or {})
    return row, hyps


def markdown_table(rows: list[dict]) -> str:
    lines = ["| set | beam | sentences | BLEU | chrF | chrF 95% CI | sent/s |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['set']} | {r['beam']} | {r['sentences']} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
              f"±{r['chrf_ci95']:.2f} | {r['sentences_per_s']:.1f} |" for r in rows]
    spans = [r for r in rows if "protected_spans" in r]
    if spans:
        lines += ["", "Protected spans (placeholders, tags, URLs) in the best hypothesis, exactly as in the source:", "",
                  "| set | beam | sentences with spans | spans | spans back (returned) | sentences all back (returned) "
                  "| spans back (model alone) | sentences all back (model alone) | placed as in the reference |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in spans:
            s = r["protected_spans"]
            lines.append(f"| {r['set']} | {r['beam']} | {s['sentences_with_spans']} | {s['spans']} | "
                         f"{s['spans_returned']:.2f}% | {s['sentences_returned']:.2f}% | {s['spans_model']:.2f}% | "
                         f"{s['sentences_model']:.2f}% | {s.get('placed_as_reference', 0):.2f}% |")
    return "\n".join(lines)


def evaluate(model_dir: str, data_dir: str, sets: list[str], beams: list[int], limit: int | None = None,
             threads: int = 2, batch_tokens: int = 4096, hyp_dir: str | None = None,
             dtype: str = "float32", capitals: bool = False, no_sentinels: bool = False,
             shortlist: bool = True, length_penalty: float | None = None) -> dict:
    """Score each set at each beam size; with `capitals`, each set written in capitals (sources and
    references upper-cased: how the model does on text such as UI labels in capitals); with
    `no_sentinels`, the model run as if its vocabulary had no sentinel pieces: spans taken out of
    the source and put back by the attention, as for an imported model (protect.take_out, place);
    length_penalty None: the model's own (metadata.json's decoding, `nmt tune-length-penalty`)."""
    torch.set_num_threads(threads)
    translator = Translator.load(model_dir, device="cpu", dtype=dtype, shortlist=shortlist)
    if no_sentinels:
        translator.tokenizer.has_sentinels = False
    # a corpus holds NAME.en and NAME.de; the model's languages say which is the source
    src_lang, tgt_lang = translator.metadata.get("source_lang", "en"), translator.metadata.get("target_lang", "de")
    rows = []
    for name in sets:
        src = read_lines(Path(data_dir) / f"{name}.{src_lang}")[:limit]
        ref = read_lines(Path(data_dir) / f"{name}.{tgt_lang}")[:limit]
        if capitals:
            src, ref = [s.upper() for s in src], [r.upper() for r in ref]
        for beam in beams:
            row, hyps = evaluate_set(translator, src, ref, beam, batch_tokens, length_penalty)
            rows.append({"set": name, **row})
            print(f"{name} beam {beam}: BLEU {row['bleu']:.2f} chrF {row['chrf']:.2f} ±{row['chrf_ci95']:.2f} "
                  f"({row['sentences_per_s']:.1f} sent/s)", file=sys.stderr, flush=True)
            if hyp_dir:
                Path(hyp_dir).mkdir(parents=True, exist_ok=True)
                (Path(hyp_dir) / f"{name}.beam{beam}.{tgt_lang}").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    return {"model": str(model_dir), "metadata": translator.metadata, "threads": threads, "dtype": translator.dtype,
            "limit": limit, "capitals": capitals, "no_sentinels": no_sentinels,
            "shortlist": translator.shortlist is not None,
            "length_penalty": translator.length_penalty if length_penalty is None else length_penalty,
            "results": rows}


def eval_command(args) -> dict:
    report = evaluate(args.model, args.data, [s for s in args.sets.split(",") if s],
                      [int(b) for b in args.beams.split(",")], args.limit, args.threads, args.batch_tokens,
                      args.hyp_dir, args.dtype, args.capitals, args.no_sentinels, not args.no_shortlist,
                      args.length_penalty)
    print(markdown_table(report["results"]))
    for metric in ("bleu", "chrf"):
        for signature in sorted({r[f"{metric}_signature"] for r in report["results"]}):
            print(f"{'BLEU' if metric == 'bleu' else 'chrF'} signature: {signature}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report


def add_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--data", default="data/corpus")
    p.add_argument("--sets", default="test_sw,test_general", help="comma-separated set names (NAME.en/NAME.de)")
    p.add_argument("--beams", default="1,4")
    p.add_argument("--limit", type=int, help="first N sentences of each set")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--hyp-dir", help="also write the hypotheses here")
    p.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16", "float16", "int8"],
                   help="compute type of the model (CPU)")
    p.add_argument("--no-sentinels", action="store_true", help="run the model as one without sentinel pieces: "
                   "spans taken out and put back by the attention (how imported models keep them)")
    p.add_argument("--capitals", action="store_true", help="score the sets written in capitals (sources and "
                   "references upper-cased)")
    p.add_argument("--no-shortlist", action="store_true", help="decode over the whole vocabulary even where the "
                   "model has a vocabulary shortlist (model/shortlist.py)")
    p.add_argument("--length-penalty", type=float, help="score = log-prob / length^alpha (default: the model's "
                   "own, from its metadata.json; 1.0 where it has none)")
    p.add_argument("--out", help="write the JSON report here")


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="BLEU/chrF of a checkpoint on the test sets")
    add_eval_args(p)
    p.set_defaults(func=eval_command)


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m training.evaluate")
    add_eval_args(parser)
    return eval_command(parser.parse_args(argv))


if __name__ == "__main__":
    main()
