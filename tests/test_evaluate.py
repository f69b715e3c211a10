"""`nmt eval` on a tiny over-fitted checkpoint: scores, signatures, table, JSON, determinism."""

from __future__ import annotations

import argparse
import json

from tests.test_train import overfit_model, pairs  # noqa: F401 - overfit_model: the shared fixture
from training import evaluate, train


def test_eval_scores_table_and_json(overfit_model, tmp_path, capsys):
    model_dir, corpus = overfit_model
    out = tmp_path / "eval.json"
    evaluate.main(["--model", str(model_dir), "--data", str(corpus), "--sets", "test_sw", "--beams", "1,4",
                   "--threads", "1", "--out", str(out), "--hyp-dir", str(tmp_path / "hyps")])
    printed = capsys.readouterr().out
    assert "| test_sw | 1 | 20 | 100.00 | 100.00 | ±0.00 |" in printed
    assert "| test_sw | 4 | 20 | 100.00 | 100.00 | ±0.00 |" in printed
    assert "BLEU signature: nrefs:1|bs:1000|seed:12345|case:mixed|eff:no|tok:13a" in printed
    assert "chrF signature: nrefs:1|bs:1000" in printed
    report = json.loads(out.read_text())
    assert [(r["set"], r["beam"]) for r in report["results"]] == [("test_sw", 1), ("test_sw", 4)]
    assert all(r["sentences_per_s"] > 0 for r in report["results"])
    assert report["metadata"]["source_lang"] == "en"
    assert (tmp_path / "hyps" / "test_sw.beam4.de").read_text().splitlines()[0] == pairs(1)[0][1]


def test_eval_is_deterministic_and_limit_works(overfit_model):
    model_dir, corpus = overfit_model
    runs = [evaluate.evaluate(str(model_dir), str(corpus), ["test_sw"], [2], limit=7, threads=1) for _ in range(2)]
    strip = [[{k: v for k, v in r.items() if k not in ("seconds", "sentences_per_s")} for r in x["results"]]
             for x in runs]
    assert strip[0] == strip[1] and strip[0][0]["sentences"] == 7


def test_register_adds_eval_subcommand():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    evaluate.register(sub)
    train.register(sub)
    args = parser.parse_args(["eval", "--model", "m"])
    assert args.func is evaluate.eval_command and args.beams == "1,4"
    args = parser.parse_args(["train", "--out", "r", "--time-budget", "5"])
    assert args.func is train.train_command and args.time_budget == 5 and args.threads is None
    assert parser.parse_args(["average", "--run", "r", "--out", "o"]).func is train.average_command


def test_span_scores_count_what_came_back_and_what_the_model_wrote():
    from model.results import Translation, TranslationResult

    def result(text, inserted=()):
        return TranslationResult([], [Translation(text, [], [], 0.0, 0.0, True, spans_inserted=list(inserted))])

    sources = ["Open %s in {0}.", "No spans.", "Delete %d of %d files?"]
    results = [result("Öffne %s in {0}."), result("Keine."), result("%d von %d Dateien löschen?", inserted=[1])]
    s = evaluate.span_scores(sources, results)
    assert (s["sentences_with_spans"], s["spans"]) == (2, 4)
    assert s["spans_returned"] == 100.0 and s["sentences_returned"] == 100.0
    assert s["spans_model"] == 50.0 and s["sentences_model"] == 50.0  # the repaired one counts as wrong
    s = evaluate.span_scores(sources[:1], [result("Öffne in {0}.")])
    assert s["spans_returned"] == 50.0 and s["sentences_returned"] == 0.0
    assert evaluate.span_scores(["plain"], [result("schlicht")]) is None


def test_scores_carry_a_bootstrap_confidence_interval():
    """Half the hypotheses right: an interval that is neither zero nor the whole scale, the same
    on every call (a fixed seed), and wider on fewer sentences."""
    refs = [f"Das ist der Satz Nummer {i} über das Wetter in Berlin." for i in range(200)]
    hyps = [r if i % 2 else "Etwas ganz anderes." for i, r in enumerate(refs)]
    s = evaluate.score(hyps, refs)
    assert 0.5 < s["chrf_ci95"] < 20 and 0.5 < s["bleu_ci95"] < 30
    assert evaluate.score(hyps, refs) == s
    assert "bs:1000" in s["chrf_signature"]
    assert evaluate.score(hyps[:40], refs[:40])["chrf_ci95"] > s["chrf_ci95"]


def test_eval_in_capitals_scores_upper_cased_sets(overfit_model, tmp_path):
    """--capitals: sources and references upper-cased; the translations come back in capitals."""
    model_dir, corpus = overfit_model
    report = evaluate.evaluate(str(model_dir), str(corpus), ["test_sw"], [1], limit=6, threads=1,
                               hyp_dir=str(tmp_path), capitals=True)
    assert report["capitals"] is True
    hyps = (tmp_path / "test_sw.beam1.de").read_text().splitlines()
    assert len(hyps) == 6 and all(h == h.upper() for h in hyps) and any(h != h.lower() for h in hyps)
