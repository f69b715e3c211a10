"""Training: tokenizer -> steps -> checkpoint -> Translator; over-fitting; exact resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from safetensors.torch import load_file
from sentencepiece import sentencepiece_model_pb2

from model.checkpoint import load_checkpoint, save_checkpoint, stored_state
from model.config import ModelConfig
from model.transformer import Transformer
from model.translator import Translator
from training import train
from training.corpus import DING_FILE, DING_PACKAGE

ADJ = [("red", "rote"), ("small", "kleine"), ("old", "alte"), ("green", "grüne"), ("new", "neue")]
NOUN = [("cat", "Katze"), ("window", "Fenster"), ("file", "Datei"), ("door", "Tür")]
VERB = [("sleeps", "schläft"), ("opens", "öffnet sich"), ("is closed", "ist geschlossen")]


def pairs(n: int) -> list[tuple[str, str]]:
    """Tiny, regular English-German pairs: "The red cat sleeps." -> "Die rote Katze schläft." """
    out = []
    for i in range(n):
        (ae, ad), (ne, nd), (ve, vd) = ADJ[i % 5], NOUN[(i // 5) % 4], VERB[(i // 20) % 3]
        out.append((f"The {ae} {ne} {ve}.", f"Die {ad} {nd} {vd}."))
    return out


def write_corpus(root: Path, train_pairs, dev_pairs) -> Path:
    d = root / "corpus"
    d.mkdir(parents=True)
    for name, ps in (("train", train_pairs), ("dev", dev_pairs), ("test_sw", dev_pairs)):
        (d / f"{name}.en").write_text("".join(e + "\n" for e, _ in ps), encoding="utf-8")
        (d / f"{name}.de").write_text("".join(g + "\n" for _, g in ps), encoding="utf-8")
    sources = ["ding_dict" if i % 10 == 9 else "lohelp" for i in range(len(train_pairs))]
    (d / "train.source").write_text("".join(s + "\n" for s in sources))
    return d


TINY = ["--threads", "1", "--vocab-size", "340", "--d-model", "32", "--heads", "4", "--ff", "64",
        "--encoder-layers", "1", "--decoder-layers", "1", "--max-positions", "64", "--log-every", "1",
        "--save-minutes", "1000", "--dev-bleu-size", "10"]


def run(corpus: Path, out: Path, *extra: str) -> Path:
    return train.main(["train", "--data", str(corpus), "--out", str(out), *TINY, *extra])


def log_records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def test_end_to_end(tmp_path):
    corpus = write_corpus(tmp_path, pairs(60), pairs(60)[:8])
    run_dir = run(corpus, tmp_path / "run", "--max-steps", "30", "--max-tokens", "200", "--accum", "2",
                  "--lr", "3e-3", "--warmup", "10", "--dict-keep", "3")
    sp = spm.SentencePieceProcessor(model_file=str(run_dir / "spm.model"))
    assert [sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()] == [0, 1, 2, 3]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["decoder_start_id"] == 2 and config["share_embeddings"] and config["tie_output"]

    losses = [r["loss"] for r in log_records(run_dir) if "loss" in r]
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    dev = [r for r in log_records(run_dir) if "dev_loss" in r]
    assert dev and dev[-1]["dev_bleu"] is not None

    final = run_dir / "final"
    meta = json.loads((final / "metadata.json").read_text())
    assert meta["source_lang"] == "en" and meta["target_lang"] == "de"
    assert meta["training"]["steps"] == 30 and meta["training"]["data"]["ding_dict_kept"] == 3
    [result] = Translator.load(final, device="cpu", dtype="float32").translate(["The red cat sleeps."], beam_size=2)
    assert isinstance(result.hypotheses[0].text, str)


@pytest.fixture(scope="session")
def overfit_model(tmp_path_factory) -> tuple[Path, Path]:
    """(final checkpoint, corpus) of a tiny model trained to memorise pairs(20); shared with
    test_evaluate.py, so the 250 steps run once."""
    root = tmp_path_factory.mktemp("overfit")
    data = pairs(20)
    corpus = write_corpus(root, data, data)
    run_dir = train.main([
        "train", "--data", str(corpus), "--out", str(root / "run"), "--threads", "1", "--vocab-size", "340",
        "--d-model", "64", "--heads", "4", "--ff", "128", "--encoder-layers", "2", "--decoder-layers", "1",
        "--max-positions", "64", "--dropout", "0", "--label-smoothing", "0", "--lr", "3e-3", "--warmup", "20",
        "--max-tokens", "400", "--accum", "1", "--max-steps", "250", "--dict-keep", "-1", "--log-every", "50",
        "--save-minutes", "1000", "--dev-bleu-size", "0", "--average-last", "1"])
    return run_dir / "final", corpus


def test_overfit_then_translate_exactly(overfit_model):
    data = pairs(20)
    translator = Translator.load(overfit_model[0], device="cpu", dtype="float32")
    sources, references = [e for e, _ in data], [g for _, g in data]
    for beam in (1, 4):
        hyps = [r.hypotheses[0].text for r in translator.translate(sources, beam_size=beam)]
        assert hyps == references, f"beam {beam}"


def test_resume_matches_uninterrupted_run(tmp_path):
    corpus = write_corpus(tmp_path, pairs(40), pairs(40)[:4])
    common = ["--max-tokens", "120", "--accum", "2", "--save-every", "3", "--dropout", "0.3", "--dict-keep", "2"]
    straight = run(corpus, tmp_path / "straight", *common, "--max-steps", "6")
    stopped = run(corpus, tmp_path / "resumed", *common, "--max-steps", "3")
    resumed = train.main(["train", "--out", str(stopped), "--resume", "--max-steps", "6", "--threads", "1"])

    a = straight / "checkpoints" / "step_0000006"
    b = resumed / "checkpoints" / "step_0000006"
    ta, tb = load_file(str(a / "state.safetensors")), load_file(str(b / "state.safetensors"))
    assert sorted(ta) == sorted(tb)
    assert any(k.startswith("optim.") for k in ta) and "rng.torch" in ta
    for k in ta:
        torch.testing.assert_close(ta[k], tb[k], rtol=0, atol=1e-6, msg=k)
    sa = json.loads((a / "state.json").read_text())["train_state"]
    sb = json.loads((b / "state.json").read_text())["train_state"]
    for key in ("step", "epoch", "position", "src_tokens", "tgt_tokens"):
        assert sa[key] == sb[key], key
    assert sa["epoch"] >= 1  # the run crossed an epoch boundary, so data order was re-derived
    steps = [r["step"] for r in log_records(resumed) if "loss" in r]
    assert steps == list(range(1, 7))  # the log keeps one record per step across the resume


def test_restore_goes_on_from_an_average_with_the_runs_counters_and_curve(tmp_path):
    """A lost run directory: `average --last 1` of its last checkpoint brings back its weights,
    settings, counters and dev curve; Adam starts empty, so the learning rate ramps up again."""
    corpus = write_corpus(tmp_path, pairs(40), pairs(40)[:4])
    first = run(corpus, tmp_path / "lost", "--max-tokens", "120", "--accum", "2", "--save-every", "3",
                "--dict-keep", "2", "--lr", "2e-3", "--warmup", "4", "--max-steps", "6")
    snapshot = tmp_path / "snapshot"
    train.main(["average", "--run", str(first), "--last", "1", "--out", str(snapshot)])
    record = json.loads((snapshot / "metadata.json").read_text())["run"]
    assert record["train_state"]["step"] == 6 and record["args"]["warmup"] == 4
    assert [r["step"] for r in record["dev_curve"]] == [3, 6]
    shutil.rmtree(first)

    # no further steps: the restored run's weights are the snapshot's
    still = train.main(["train", "--restore", str(snapshot), "--data", str(corpus), "--out", str(tmp_path / "still"),
                        "--max-steps", "6", "--threads", "1"])
    weights = load_file(str(snapshot / "model.safetensors"))
    state = load_file(str(still / "checkpoints" / "step_0000006" / "state.safetensors"))
    for name, tensor in weights.items():
        torch.testing.assert_close(state[f"model.{name}"], tensor, rtol=0, atol=0, msg=name)

    went_on = train.main(["train", "--restore", str(snapshot), "--data", str(corpus), "--out", str(tmp_path / "on"),
                          "--max-steps", "9", "--threads", "1"])
    records = log_records(went_on)
    assert [r["step"] for r in records if "dev_loss" in r and "final" not in r] == [3, 6, 9]  # the curve goes on
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [7, 8, 9]
    expected = [train.inverse_sqrt_lr(s, 2e-3, 4) * (s - 6) / train.RESTORE_REWARM_STEPS for s in (7, 8, 9)]
    assert [r["lr"] for r in steps] == pytest.approx(expected)
    before = json.loads((snapshot / "metadata.json").read_text())["run"]["train_state"]
    after = json.loads((went_on / "checkpoints" / "step_0000009" / "state.json").read_text())["train_state"]
    assert after["tgt_tokens"] > before["tgt_tokens"] and after["elapsed"] >= before["elapsed"]
    assert (after["epoch"], after["position"]) > (before["epoch"], before["position"])

    with pytest.raises(SystemExit, match="already has checkpoints"):
        train.main(["train", "--restore", str(snapshot), "--data", str(corpus), "--out", str(went_on)])
    plain = tmp_path / "plain"
    shutil.copytree(snapshot, plain)
    meta = json.loads((plain / "metadata.json").read_text())
    (plain / "metadata.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "run"}))
    with pytest.raises(SystemExit, match="no run record"):
        train.main(["train", "--restore", str(plain), "--data", str(corpus), "--out", str(tmp_path / "x")])


def test_bf16_is_set_per_session_on_resume(tmp_path):
    corpus = write_corpus(tmp_path, pairs(20), pairs(20)[:4])
    run_dir = run(corpus, tmp_path / "run", "--max-tokens", "120", "--dict-keep", "2", "--bf16", "--max-steps", "1")
    assert json.loads((run_dir / "args.json").read_text())["bf16"] is True
    train.main(["train", "--out", str(run_dir), "--resume", "--no-bf16", "--max-steps", "2", "--threads", "1"])
    train.main(["train", "--out", str(run_dir), "--resume", "--max-steps", "3", "--threads", "1"])
    assert [r["bf16"] for r in log_records(run_dir) if "resume" in r] == [False, True]


def test_batches_respect_token_budget_and_cover_epoch():
    import numpy as np

    src = np.array([3, 5, 9, 2, 7, 4, 11, 6] * 10)
    tgt = np.array([4, 6, 8, 3, 7, 5, 10, 2] * 10)
    batches = train.make_batches(src, tgt, 40, seed=1, epoch=0, sort_chunk=16)
    assert sorted(np.concatenate(batches).tolist()) == list(range(80))
    assert all(len(b) * max(max(src[i], tgt[i]) for i in b) <= 40 for b in batches)
    again = train.make_batches(src, tgt, 40, seed=1, epoch=0, sort_chunk=16)
    assert all((x == y).all() for x, y in zip(batches, again))


def test_inverse_sqrt_schedule():
    assert train.inverse_sqrt_lr(50, 1e-3, 100) == pytest.approx(5e-4)
    assert train.inverse_sqrt_lr(100, 1e-3, 100) == pytest.approx(1e-3)
    assert train.inverse_sqrt_lr(400, 1e-3, 100) == pytest.approx(5e-4)


def test_spans_become_sentinels_and_come_back(overfit_model, tmp_path):
    """Training masks placeholders and tags as sentinels (single pieces of the vocabulary), and the
    Translator gets each back, exactly, in every hypothesis, even from a model that never saw them."""
    final, corpus = overfit_model
    sp = spm.SentencePieceProcessor(model_file=str(final / "source.spm"))
    assert sp.encode("\ue000", out_type=str)[-1] == "\ue000" and sp.get_piece_size() >= 32
    loaded = train.load_training_corpus(corpus, -1, 1)
    assert loaded.description["dropped_span_mismatch"] == 0
    translator = Translator.load(final, device="cpu", dtype="float32")
    text = 'The %s cat <b>sleeps</b> at {0}, see https://example.org/x.'
    for beam in (1, 4):
        [result] = translator.translate([text], beam_size=beam, n_best=beam)
        assert result.spans == ["%s", "<b>", "</b>", "{0}", "https://example.org/x"]
        for h in result.hypotheses:
            for span in result.spans:
                assert h.text.count(span) == 1, (span, h.text)
            assert not any(0xE000 <= ord(c) < 0xE020 for c in h.text)


def test_init_from_grows_the_vocabulary_by_the_sentinels(overfit_model, tmp_path):
    """A run started from a checkpoint whose vocabulary lacks the sentinels (older models) keeps its
    pieces and weights and appends the sentinels as new pieces."""
    final, corpus = overfit_model
    plain = tmp_path / "plain"
    shutil.copytree(final, plain)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((final / "source.spm").read_bytes())
    kept = [p for p in proto.pieces if not 0xE000 <= ord(p.piece[0]) < 0xE020]
    del proto.pieces[:]
    proto.pieces.extend(kept)
    for name in ("source.spm", "target.spm"):
        (plain / name).write_bytes(proto.SerializeToString())
    old_model, _, _ = load_checkpoint(final)
    small = Transformer(ModelConfig(**{**json.loads((final / "config.json").read_text()),
                                       "src_vocab_size": len(kept), "tgt_vocab_size": len(kept)}))
    for name, t in stored_state(small).items():
        t.data.copy_(stored_state(old_model)[name][: t.size(0)])
    save_checkpoint(plain, small, plain / "source.spm", plain / "target.spm", {"source_lang": "en", "target_lang": "de"})
    run_dir = run(corpus, tmp_path / "grown", "--init-from", str(plain), "--max-steps", "1", "--lr", "0")
    sp = spm.SentencePieceProcessor(model_file=str(run_dir / "spm.model"))
    assert sp.get_piece_size() == len(kept) + 32 and sp.id_to_piece(len(kept)) == "\ue000"
    grown = load_file(str(train.list_checkpoints(run_dir)[-1] / "state.safetensors"))
    embed = grown["model.src_embed.weight"]
    assert embed.shape[0] == len(kept) + 32
    torch.testing.assert_close(embed[: len(kept)], stored_state(small)["src_embed.weight"])


def test_grow_encoder_starts_as_the_checkpoint_and_then_trains(overfit_model, tmp_path):
    """--grow-encoder 4 from a 2-layer encoder: before any update the deeper model's logits are the
    checkpoint's; a copy's output projections are zero and its other weights are its layer's."""
    final, corpus = overfit_model
    old_model, _, _ = load_checkpoint(final)
    run_dir = run(corpus, tmp_path / "deep", "--init-from", str(final), "--grow-encoder", "4",
                  "--max-steps", "1", "--lr", "0")
    config = ModelConfig.load(run_dir / "config.json")
    assert config.encoder_layers == 4 and config.decoder_layers == old_model.config.decoder_layers
    state = load_file(str(train.list_checkpoints(run_dir)[-1] / "state.safetensors"))
    deep = Transformer(config)
    train.load_weights(deep, {k[len("model."):]: t for k, t in state.items() if k.startswith("model.")})
    old = stored_state(old_model)
    assert not deep.encoder_layers[1].self_attn.out_proj.weight.any()
    assert not deep.encoder_layers[1].ffn.w2.bias.any()
    torch.testing.assert_close(deep.encoder_layers[3].ffn.w1.weight, old["encoder_layers.1.ffn.w1.weight"])
    torch.testing.assert_close(deep.encoder_layers[2].ffn.w2.weight, old["encoder_layers.1.ffn.w2.weight"])
    src = torch.tensor([[5, 9, 14, 3], [7, 3, 0, 0]])
    tgt = torch.tensor([[2, 11, 6], [2, 8, 0]])
    with torch.no_grad():
        torch.testing.assert_close(deep.eval()(src, tgt), old_model.float().eval()(src, tgt))
    with pytest.raises(ValueError, match="not a multiple"):
        train.deepen_encoder(old, 2, 3)


def test_grow_encoder_refuses_a_shape_it_cannot_grow(overfit_model, tmp_path):
    final, corpus = overfit_model
    with pytest.raises(SystemExit, match="not a multiple"):
        run(corpus, tmp_path / "odd", "--init-from", str(final), "--grow-encoder", "3", "--max-steps", "1")
    post = tmp_path / "post"
    shutil.copytree(final, post)
    config = json.loads((post / "config.json").read_text())
    (post / "config.json").write_text(json.dumps({**config, "norm": "post"}))
    with pytest.raises(SystemExit, match="pre-norm"):
        run(corpus, tmp_path / "from_post", "--init-from", str(post), "--grow-encoder", "4", "--max-steps", "1")


def test_a_run_with_term_annotations_writes_a_model_that_reads_them(tmp_path):
    corpus = write_corpus(tmp_path, pairs(60), pairs(60)[:8])
    ding = tmp_path / "cache" / "extract" / f"{DING_PACKAGE}_1.0" / DING_FILE
    ding.parent.mkdir(parents=True)
    ding.write_text("Katze {f} :: cat\nFenster {n} :: window\nAuto {n} :: car\n", encoding="utf-8")
    run_dir = run(corpus, tmp_path / "run", "--max-steps", "2", "--max-tokens", "200", "--dict-keep", "-1",
                  "--term-annotations", "1", "--cache", str(tmp_path / "cache"))
    meta = json.loads((run_dir / "final" / "metadata.json").read_text())
    # of the 30 pairs with a cat or a window (each source term has one gloss: the usual one), some
    data = meta["training"]["data"]
    assert 0 < data["term_annotated_pairs"] == data["pairs_with_usual_terms"] < 30 and meta["term_annotations"] == 1.0
    assert Translator.load(run_dir / "final", device="cpu", dtype="float32").reads_annotations
    plain = run(corpus, tmp_path / "plain", "--max-steps", "1", "--max-tokens", "200")
    assert not Translator.load(plain / "final", device="cpu", dtype="float32").reads_annotations

    # a fork of the plain run learns to read them while it cools: --term-annotations goes with --switch-data
    with pytest.raises(SystemExit, match="goes with --switch-data"):
        train.main(["train", "--fork", str(plain), "--out", str(tmp_path / "refused"), "--term-annotations", "1"])
    assert not (tmp_path / "refused").exists()
    train.main(["train", "--fork", str(plain), "--out", str(tmp_path / "fork"), "--switch-data", str(corpus),
                "--term-annotations", "1", "--cache", str(tmp_path / "cache"), "--cooldown", "2", "--max-steps", "3",
                "--threads", "1"])
    meta = json.loads((tmp_path / "fork" / "final" / "metadata.json").read_text())
    assert meta["term_annotations"] == 1.0 and meta["training"]["data"]["term_annotated_pairs"] > 0
    assert Translator.load(tmp_path / "fork" / "final", device="cpu", dtype="float32").reads_annotations

    # a vocabulary without the annotation tags (a run older than them) is refused, not trained on
    text = tmp_path / "text.txt"
    text.write_text("".join(f"{en}\n{de}\n" for en, de in pairs(60)), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "old"), vocab_size=60,
                                   hard_vocab_limit=False, minloglevel=2)
    with pytest.raises(SystemExit, match="no pieces for the annotation tags"):
        run(corpus, tmp_path / "old_vocab", "--spm", str(tmp_path / "old.model"), "--max-steps", "1",
            "--term-annotations", "1", "--cache", str(tmp_path / "cache"))


def test_subsample_cuts_and_repeat_repeats_a_source(tmp_path):
    rows = [(f"Bible verse number {i}.", f"Bibelvers Nummer {i}.", "bible") for i in range(10)]
    rows += [(f"Example sentence {i} here.", f"Beispielsatz {i} hier.", "ding") for i in range(3)]
    rows += [(f"Menu entry {i}", f"Menüeintrag {i}", "gettext") for i in range(4)]
    for ext, col in (("en", 0), ("de", 1), ("source", 2)):
        (tmp_path / f"train.{ext}").write_text("".join(r[col] + "\n" for r in rows), encoding="utf-8")
    loaded = train.load_training_corpus(tmp_path, -1, 1, subsample={"bible": 4}, repeat={"ding": 3})
    assert loaded.description["pairs_by_source"] == {"bible": 4, "ding": 9, "gettext": 4}
    bible = [e for e in loaded.source if e.startswith("Bible")]
    assert len(set(bible)) == 4  # four different verses, not one repeated
    assert train.parse_counts("bible=30000, ding=2") == {"bible": 30000, "ding": 2}


def test_a_resumed_run_switches_corpus_from_the_next_epoch(tmp_path):
    corpus = write_corpus(tmp_path / "a", pairs(40), pairs(40)[:6])
    run_dir = run(corpus, tmp_path / "run", "--max-tokens", "120", "--dict-keep", "2", "--max-steps", "2")
    bigger = write_corpus(tmp_path / "b", pairs(60), pairs(40)[:6])  # more pairs, the same dev set
    (bigger / "train.source").write_text("".join(("stories" if i >= 40 else "lohelp") + "\n" for i in range(60)))
    train.main(["train", "--out", str(run_dir), "--resume", "--switch-data", str(bigger), "--repeat", "stories=3",
                "--max-steps", "4", "--threads", "1"])
    switch = [r for r in log_records(run_dir) if "data_switch" in r]
    assert switch == [{"data_switch": True, "step": 2, "from": str(corpus), "to": str(bigger),
                       "repeat": "stories=3", "pairs": 40 + 20 * 3}]
    state = json.loads((run_dir / "checkpoints" / "step_0000004" / "state.json").read_text())["train_state"]
    assert (state["epoch"], state["position"]) == (1, 4)  # a fresh epoch of the new corpus: 2 steps of 2 batches
    saved = json.loads((run_dir / "args.json").read_text())
    assert (saved["data"], saved["repeat"]) == (str(bigger), "stories=3")  # a later --resume stays on it
    train.main(["train", "--out", str(run_dir), "--resume", "--max-steps", "5", "--threads", "1"])
    assert json.loads((run_dir / "checkpoints" / "step_0000005" / "state.json").read_text())["train_state"][
        "position"] == 6

    other_dev = write_corpus(tmp_path / "c", pairs(60), pairs(60)[10:16])
    with pytest.raises(SystemExit, match="dev.en is not the run's"):
        train.main(["train", "--out", str(run_dir), "--resume", "--switch-data", str(other_dev)])
    with pytest.raises(SystemExit, match="goes with --switch-data"):
        train.main(["train", "--out", str(run_dir), "--resume", "--repeat", "stories=2"])
    with pytest.raises(SystemExit, match="goes with --switch-data"):
        train.main(["train", "--out", str(run_dir), "--resume", "--back-translated"])
    with pytest.raises(SystemExit, match="goes with --resume"):
        run(corpus, tmp_path / "fresh", "--switch-data", str(bigger))
    with pytest.raises(SystemExit, match="--repeat and --back-translated go with a fresh run"):
        train.main(["train", "--restore", str(run_dir / "final"), "--data", str(corpus), "--out",
                    str(tmp_path / "restored"), "--repeat", "stories=2"])


def test_cooldown_of_a_fork_leaves_the_main_run_free_to_train_on(tmp_path):
    """The fork goes on from the main run's last checkpoint with the learning rate falling linearly
    to zero, then stops for good; the main run's directory is untouched and resumes unchanged."""
    corpus = write_corpus(tmp_path, pairs(40), pairs(40)[:4])
    main_run = run(corpus, tmp_path / "main", "--max-tokens", "120", "--accum", "1", "--save-every", "3",
                   "--dict-keep", "2", "--lr", "2e-3", "--warmup", "4", "--max-steps", "6")
    main_files = sorted(p.relative_to(main_run) for p in main_run.rglob("*"))
    cooled = train.main(["train", "--fork", str(main_run), "--out", str(tmp_path / "cool"), "--cooldown", "4",
                         "--max-steps", "0", "--threads", "1"])

    steps = [r for r in log_records(cooled) if "loss" in r and r["step"] > 6]
    assert [r["step"] for r in steps] == [7, 8, 9, 10]
    expected = [train.inverse_sqrt_lr(s, 2e-3, 4) * (11 - s) / 4 for s in (7, 8, 9, 10)]
    assert [r["lr"] for r in steps] == pytest.approx(expected)
    forked = load_file(str(main_run / "checkpoints" / "step_0000006" / "state.safetensors"))
    assert any(k.startswith("optim.") for k in forked)  # Adam came along: no rewarm in `expected`
    final = json.loads((cooled / "final" / "metadata.json").read_text())["training"]
    assert final["steps"] == 10
    assert set(final["weights"]["averaged_checkpoints"]) <= {"step_0000009", "step_0000010"}
    with pytest.raises(SystemExit, match="cooled down"):
        train.main(["train", "--out", str(cooled), "--resume", "--max-steps", "12", "--threads", "1"])
    snapshot = tmp_path / "cooled-snapshot"
    train.main(["average", "--run", str(cooled), "--last", "1", "--out", str(snapshot)])
    with pytest.raises(SystemExit, match="cooled down"):
        train.main(["train", "--restore", str(snapshot), "--data", str(corpus), "--out", str(tmp_path / "again"),
                    "--threads", "1"])

    assert sorted(p.relative_to(main_run) for p in main_run.rglob("*")) == main_files
    went_on = train.main(["train", "--out", str(main_run), "--resume", "--max-steps", "7", "--threads", "1"])
    [step7] = [r for r in log_records(went_on) if "loss" in r and r["step"] == 7]
    assert step7["lr"] == pytest.approx(train.inverse_sqrt_lr(7, 2e-3, 4))
    with pytest.raises(SystemExit, match="new --out"):
        train.main(["train", "--fork", str(main_run), "--out", str(cooled), "--cooldown", "2"])


def test_average_of_two_forks_is_the_mean_of_their_last_checkpoints(tmp_path):
    corpus = write_corpus(tmp_path, pairs(40), pairs(40)[:4])
    main_run = run(corpus, tmp_path / "main", "--max-tokens", "120", "--accum", "1", "--dict-keep", "2",
                   "--lr", "2e-3", "--warmup", "4", "--max-steps", "4")
    forks = [train.main(["train", "--fork", str(main_run), "--out", str(tmp_path / name), "--cooldown", str(n),
                         "--max-steps", "0", "--threads", "1"]) for name, n in (("cool-a", 2), ("cool-b", 3))]
    soup = train.main(["average", "--run", str(forks[0]), "--run", str(forks[1]), "--last", "1",
                       "--out", str(tmp_path / "soup")])

    lasts = [train.list_checkpoints(f)[-1] for f in forks]
    assert [c.name for c in lasts] == ["step_0000006", "step_0000007"]
    states = [load_file(str(c / "state.safetensors")) for c in lasts]
    averaged = load_file(str(soup / "model.safetensors"))
    name = "encoder_layers.0.ffn.w1.weight"
    assert not torch.equal(states[0][f"model.{name}"], states[1][f"model.{name}"])
    assert torch.allclose(averaged[name], (states[0][f"model.{name}"] + states[1][f"model.{name}"]) / 2)
    meta = json.loads((soup / "metadata.json").read_text())
    assert meta["averaged_checkpoints"] == [f"{forks[0]}/step_0000006", f"{forks[1]}/step_0000007"]
    assert meta["run"]["train_state"]["step"] == 6  # the first run's counters

    other = run(corpus, tmp_path / "other", "--max-tokens", "120", "--max-steps", "1", "--d-model", "48")
    with pytest.raises(SystemExit, match="config.json is not"):
        train.main(["average", "--run", str(forks[0]), "--run", str(other), "--out", str(tmp_path / "bad")])


def test_direction_de_en_reads_the_same_pairs_the_other_way(tmp_path):
    rows = [(f"Open file {i} now.", f"Datei {i} jetzt öffnen.", "lohelp") for i in range(12)]
    rows += [(f"Menu {i}", f"Menü {i}", "gettext") for i in range(6)]
    for ext, col in (("en", 0), ("de", 1), ("source", 2)):
        (tmp_path / f"train.{ext}").write_text("".join(r[col] + "\n" for r in rows), encoding="utf-8")
    forward = train.load_training_corpus(tmp_path, -1, 1, short_keep=3)
    backward = train.load_training_corpus(tmp_path, -1, 1, short_keep=3, direction="de-en")
    assert backward.source == forward.target and backward.target == forward.source  # the same rows kept
    assert backward.source[0].startswith("Datei")
    with pytest.raises(ValueError, match="one of en-de, de-en"):
        train.load_training_corpus(tmp_path, -1, 1, direction="en-fr")


def test_a_de_en_run_writes_a_de_en_checkpoint_that_nmt_eval_reads_that_way(tmp_path):
    from training.evaluate import evaluate

    corpus = write_corpus(tmp_path, pairs(40), pairs(40)[:6])
    run_dir = run(corpus, tmp_path / "run", "--direction", "de-en", "--max-steps", "2", "--max-tokens", "200")
    assert json.loads((run_dir / "args.json").read_text())["direction"] == "de-en"
    for checkpoint in (run_dir / "final", train.main(["average", "--run", str(run_dir), "--last", "1",
                                                      "--out", str(tmp_path / "avg")])):
        meta = json.loads((Path(checkpoint) / "metadata.json").read_text())
        assert (meta["source_lang"], meta["target_lang"]) == ("de", "en")
    report = evaluate(str(run_dir / "final"), str(corpus), ["test_sw"], [1], hyp_dir=str(tmp_path / "hyp"))
    assert report["results"][0]["sentences"] == 6 and (tmp_path / "hyp" / "test_sw.beam1.en").exists()
