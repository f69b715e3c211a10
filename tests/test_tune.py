"""nmt tune-length-penalty: the dev-set sweep, the choice, and what it writes."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from model.translator import Translator
from training.tune import add_tune_args, best, tune_command

DEV_EN = ["Open the file.", "Hello world, this is a small test.", "Click here.", "The dog sleeps."]
DEV_DE = ["Öffnen Sie die Datei.", "Hallo Welt, das ist ein kleiner Test.", "Hier klicken.", "Der Hund schläft."]


@pytest.fixture
def setup(tiny_checkpoint, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, model)
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "dev.en").write_text("\n".join(DEV_EN) + "\n")
    (data / "dev.de").write_text("\n".join(DEV_DE) + "\n")
    return model, data


def args_for(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_tune_args(parser)
    return parser.parse_args(list(argv))


def test_the_best_chrf_is_written_where_the_translator_reads_it(setup):
    model, data = setup
    before = json.loads((model / "metadata.json").read_text())
    decoding = tune_command(args_for("--model", str(model), "--data", str(data), "--candidates", "2.0,0.2,1.0",
                                     "--beam", "2", "--threads", "1", "--dtype", "float32"))
    sweep = decoding["chosen_on"]["sweep"]
    assert [r["length_penalty"] for r in sweep] == [0.2, 1.0, 2.0]  # sorted, each translated
    assert decoding["length_penalty"] == best(sweep)["length_penalty"]
    assert max(r["chrf"] for r in sweep) == next(r["chrf"] for r in sweep if r["length_penalty"] == decoding["length_penalty"])
    after = json.loads((model / "metadata.json").read_text())
    assert after == {**before, "decoding": decoding}  # the rest of the metadata kept
    assert Translator.load(model, device="cpu", dtype="float32").length_penalty == decoding["length_penalty"]


def test_dry_run_and_bad_candidates(setup):
    model, data = setup
    before = (model / "metadata.json").read_text()
    tune_command(args_for("--model", str(model), "--data", str(data), "--candidates", "0.5,1.5", "--beam", "2",
                          "--threads", "1", "--dtype", "float32", "--limit", "2", "--dry-run"))
    assert (model / "metadata.json").read_text() == before
    for bad in ("-1", "11", ","):
        with pytest.raises(ValueError, match="candidates"):
            tune_command(args_for("--model", str(model), "--data", str(data), "--candidates", bad))


def test_ties_go_to_the_penalty_nearest_one():
    rows = [{"length_penalty": a, "chrf": c} for a, c in ((0.6, 50.0), (1.4, 51.0), (1.8, 51.0), (0.8, 51.0))]
    assert best(rows)["length_penalty"] == 0.8
    assert best(rows[:3])["length_penalty"] == 1.4
