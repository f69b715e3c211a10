"""Vocabulary shortlists: which target ids a batch may write, how they are counted from a
corpus, and the fused int8 engine decoding over them."""

from __future__ import annotations

import shutil

import pytest
import torch

from app.registry import _fingerprint
from model import kernels
from model.config import SHORTLIST_FILE
from model.options import DecodingOptions
from model.search import columns_of
from model.shortlist import Shortlist
from model.translator import Translator
from training.shortlist import build_shortlist

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="the C++ kernels are not built here")
SENTENCES = ["the red cat sleeps .", "a big dog runs fast .", "open the file and save it ."]


def test_columns_are_the_frequent_ids_the_candidates_of_each_source_id_and_copies():
    candidates = torch.tensor([[5, 6], [7, -1], [-1, -1], [8, 5]])  # source ids 0..3
    shortlist = Shortlist(candidates, torch.tensor([1, 2]), copy_source=False)
    assert shortlist.columns([[1, 3], [3]], always=[9]).tolist() == [1, 2, 5, 7, 8, 9]
    assert shortlist.columns([[2]]).tolist() == [1, 2]  # a source id seen with nothing gives nothing
    copying = Shortlist(candidates, torch.tensor([1]), copy_source=True)
    assert copying.columns([[0, 3], [12]]).tolist() == [0, 1, 3, 5, 6, 8]  # 12 is no id of the vocabulary


def test_build_ranks_each_source_piece_by_how_often_its_pairs_hold_a_target_piece():
    # source 10 always comes with target 20, source 11 with 21 (and once with 22); 3 is in every target
    sources = [[10, 1], [10], [11], [11, 1], [11]]
    targets = [[20, 3], [20, 3], [21, 3], [21, 22, 3], [21, 3]]
    shortlist = build_shortlist(sources, targets, 12, 24, per_piece=2, frequent=1, copy_source=False)
    assert shortlist.frequent.tolist() == [3]  # the most frequent target piece, kept out of the ranking
    assert shortlist.candidates[10].tolist() == [20, -1]
    assert shortlist.candidates[11].tolist() == [21, 22]  # p = 3/3, then 1/3
    assert shortlist.candidates[1].tolist() == [20, 21]  # 20, 21 and 22 each 1/2: ties go by id
    assert shortlist.candidates[0].tolist() == [-1, -1]


def test_columns_of_finds_ids_in_sorted_columns():
    assert columns_of(torch.tensor([0, 3, 7]), (3, 0, 5, 9)) == (1, 0, -1, -1)


@needs_kernels
def test_a_shortlist_of_every_id_decodes_as_the_whole_vocabulary(tiny_sentinel_checkpoint, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_sentinel_checkpoint, model)
    plain = Translator.load(model, device="cpu", dtype="int8")
    assert plain.fused and plain.shortlist is None
    V = plain.config.tgt_vocab_size
    Shortlist(torch.full((V, 1), -1), torch.arange(V), copy_source=True).save(model)
    listed = Translator.load(model, device="cpu", dtype="int8")
    assert listed.shortlist is not None
    for a, b in zip(plain.translate(SENTENCES, beam_size=3, n_best=3), listed.translate(SENTENCES, beam_size=3, n_best=3)):
        assert [(h.text, h.score) for h in a.hypotheses] == [(h.text, h.score) for h in b.hypotheses]


@needs_kernels
def test_a_short_shortlist_keeps_every_written_token_inside_it(tiny_sentinel_checkpoint, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_sentinel_checkpoint, model)
    plain = Translator.load(model, device="cpu", dtype="int8")
    V = plain.config.tgt_vocab_size
    allowed = torch.arange(10, 40)
    Shortlist(torch.full((V, 1), -1), allowed, copy_source=False).save(model)
    listed = Translator.load(model, device="cpu", dtype="int8")
    ids = [listed.encode(s) for s in SENTENCES]
    columns = set(listed.shortlist.columns(ids, [listed.config.eos_id]).tolist())
    # the joint vocabulary: the source ids are copied in
    assert columns == set(range(10, 40)) | {i for s in ids for i in s} | {listed.config.eos_id}
    hypotheses = listed.translate_ids(ids, DecodingOptions(4, 4, 1.0, 12))
    written = {t for hyps in hypotheses for h in hyps for t in h.token_ids}
    unrestricted = {t for hyps in plain.translate_ids(ids, DecodingOptions(4, 4, 1.0, 12)) for h in hyps for t in h.token_ids}
    assert written and written <= columns and not unrestricted <= columns  # the random model strays without it
    unlisted = Translator.load(model, device="cpu", dtype="int8", shortlist=False)
    assert unlisted.shortlist is None


def test_the_fingerprint_of_a_model_covers_its_shortlist(tiny_checkpoint, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, model)
    before = _fingerprint(model)
    Shortlist(torch.full((4, 1), -1), torch.arange(4), copy_source=False).save(model)
    assert (model / SHORTLIST_FILE).exists() and _fingerprint(model) != before


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_pytorch_path_decodes_over_a_shortlist_too(tiny_sentinel_checkpoint, tmp_path, dtype):
    model = tmp_path / "model"
    shutil.copytree(tiny_sentinel_checkpoint, model)
    plain = Translator.load(model, device="cpu", dtype=dtype)
    V = plain.config.tgt_vocab_size
    Shortlist(torch.full((V, 1), -1), torch.arange(V), copy_source=True).save(model)
    listed = Translator.load(model, device="cpu", dtype=dtype)
    assert not listed.fused and listed.shortlist is not None
    for a, b in zip(plain.translate(SENTENCES, beam_size=3), listed.translate(SENTENCES, beam_size=3)):
        assert a.hypotheses[0].text == b.hypotheses[0].text
        assert a.hypotheses[0].score == pytest.approx(b.hypotheses[0].score, abs=0.05)
    Shortlist(torch.full((V, 1), -1), torch.arange(10, 40), copy_source=False).save(model)
    ids = [plain.encode(s) for s in SENTENCES]
    short = Translator.load(model, device="cpu", dtype=dtype)
    columns = set(short.shortlist.columns(ids, [short.config.eos_id]).tolist())
    written = {t for hyps in short.translate_ids(ids, DecodingOptions(3, 3, 1.0, 10)) for h in hyps for t in h.token_ids}
    assert written and written <= columns
