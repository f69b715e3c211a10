"""CTranslate2 model directories read as our checkpoints (model/convert/ctranslate2.py): files
written by CTranslate2's own converter from a random Hugging Face Marian model, in float32, int8,
int16, float16 and bfloat16, decode token for token what CTranslate2 decodes from the same file
(float32 on both sides: CTranslate2 dequantizes as we do), greedy and beam 4, and give the
log-probabilities of its score_batch; what we do not compute is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from model.checkpoint import load_checkpoint
from model.convert.ctranslate2 import CT2ImportError, import_ct2, read_model_bin
from model.translator import Translator
from tests.test_marian_parity import SOURCES, build_hf, tokenizer_files  # noqa: F401 (a fixture)

ctranslate2 = pytest.importorskip("ctranslate2")

QUANTIZATIONS = ["float32", "int8", "int16", "float16", "bfloat16"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tokenizer_files):  # noqa: F811
    root = tmp_path_factory.mktemp("ct2")
    build_hf(root / "hf", tokenizer_files, "swish", shared=True, eos_bias=-2.0)
    out = {}
    for q in QUANTIZATIONS:
        ctranslate2.converters.TransformersConverter(str(root / "hf")).convert(
            str(root / f"ct2-{q}"), quantization=None if q == "float32" else q, force=True)
        ours = import_ct2(root / f"ct2-{q}", root / f"ours-{q}", root / "hf" / "source.spm", source_lang="en",
                          target_lang="de")
        out[q] = (root / f"ct2-{q}", ours)
    return out


def tokens(ct2_dir: Path) -> list[str]:
    return json.loads((ct2_dir / "shared_vocabulary.json").read_text())


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_decodes_token_for_token_what_ctranslate2_decodes(converted, quantization):
    ct2_dir, ours_dir = converted[quantization]
    vocab = tokens(ct2_dir)
    theirs = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    ours = Translator.load(ours_dir, device="cpu", dtype="float32")
    for beam in (1, 4):
        expected = theirs.translate_batch([[vocab[i] for i in s] for s in SOURCES], beam_size=beam,
                                          max_decoding_length=20)
        got = ours.translate(SOURCES, beam_size=beam, max_length=20)
        for e, g in zip(expected, got):
            assert [vocab[i] for i in g.hypotheses[0].token_ids] == e.hypotheses[0]
    assert len({tuple(r.hypotheses[0].token_ids) for r in got}) > 1  # outputs that tell the inputs apart


@pytest.mark.parametrize("quantization", ["float32", "int8"])
def test_log_probabilities_match_score_batch(converted, quantization):
    ct2_dir, ours_dir = converted[quantization]
    vocab = tokens(ct2_dir)
    theirs = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    model, _, _ = load_checkpoint(ours_dir)
    targets = [s[:-1][::-1][:6] for s in SOURCES]  # some target token sequence per source
    scored = theirs.score_batch([[vocab[i] for i in s] for s in SOURCES], [[vocab[i] for i in t] for t in targets])
    c = model.config
    for source, target, expected in zip(SOURCES, targets, scored):
        with torch.no_grad():
            memory, mask = model.encode(torch.tensor([source]))
            logits, _ = model.decode(torch.tensor([[c.decoder_start_id] + target]), memory, mask)
        log_probs = logits.log_softmax(-1)[0]
        ours = [float(log_probs[k, t]) for k, t in enumerate(target + [c.eos_id])]
        assert ours == pytest.approx(expected.log_probs, abs=1e-4)


def test_the_checkpoint_says_where_it_came_from(converted):
    _, ours_dir = converted["int8"]
    meta = json.loads((ours_dir / "metadata.json").read_text())
    assert meta["imported_from"]["format"] == "ctranslate2" and meta["imported_from"]["quantization"] == ["int8"]
    assert (meta["source_lang"], meta["target_lang"]) == ("en", "de")


def test_what_we_do_not_compute_is_refused_by_name(tmp_path, tokenizer_files):  # noqa: F811
    build_hf(tmp_path / "hf", tokenizer_files, "gelu_new", shared=True, eos_bias=0.0)
    ctranslate2.converters.TransformersConverter(str(tmp_path / "hf")).convert(str(tmp_path / "gelu"))
    with pytest.raises(CT2ImportError, match="GELU with the tanh approximation"):
        import_ct2(tmp_path / "gelu", tmp_path / "out", tmp_path / "hf" / "source.spm")
    data = (tmp_path / "gelu" / "model.bin").read_bytes()
    (tmp_path / "cut" / "model.bin").parent.mkdir()
    (tmp_path / "cut" / "model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(CT2ImportError, match="truncated"):
        read_model_bin(tmp_path / "cut" / "model.bin")
    (tmp_path / "cut" / "model.bin").write_bytes((99).to_bytes(4, "little") + data[4:])
    with pytest.raises(CT2ImportError, match="binary version 99"):
        read_model_bin(tmp_path / "cut" / "model.bin")
    with pytest.raises(CT2ImportError, match="no model.bin"):
        import_ct2(tmp_path, tmp_path / "out", tmp_path / "hf" / "source.spm")


def interleaved_positions(n: int, d: int) -> torch.Tensor:
    """OpenNMT-py's table: sines at even dimensions, cosines at odd ones (not our halves)."""
    position = torch.arange(n, dtype=torch.float64)[:, None]
    angles = position * torch.exp(-torch.arange(0, d, 2, dtype=torch.float64) * (torch.log(torch.tensor(10000.0)) / d))
    table = torch.zeros(n, d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angles), torch.cos(angles)
    return table.float()


def test_an_opennmt_py_shaped_model_as_argos_ships_it(tmp_path):
    """Pre-norm, ReLU, OpenNMT-py's interleaved position table stored in the file, <blank> padding,
    <s> to start, and sources without </s> (add_source_eos false): written with CTranslate2's spec
    classes, read back, and decoded as CTranslate2 decodes it."""
    from model.config import ModelConfig
    from model.convert.ctranslate2 import export_ct2
    from model.transformer import Transformer
    from tests.conftest import train_tiny_spm

    torch.manual_seed(3)
    config = ModelConfig(src_vocab_size=60, tgt_vocab_size=60, d_model=32, n_heads=4, d_ff=64, encoder_layers=2,
                         decoder_layers=2, norm="pre", activation="relu", share_embeddings=True, dropout=0.0,
                         max_positions=64, pad_id=0, unk_id=1, bos_id=2, eos_id=3, decoder_start_id=2,
                         source_eos=False, position_table=True)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.positions.copy_(interleaved_positions(64, 32))
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)  # peaked outputs: fewer near-ties between the engines
    vocab = ["<blank>", "<unk>", "<s>", "</s>"] + [f"\u2581t{i}" for i in range(56)]
    export_ct2(model, vocab, vocab, tmp_path / "ct2", add_source_eos=False)
    spm_path = train_tiny_spm(tmp_path / "spm")
    ours_dir = import_ct2(tmp_path / "ct2", tmp_path / "ours", spm_path)
    imported = json.loads((ours_dir / "config.json").read_text())
    assert imported["position_table"] and not imported["source_eos"] and imported["norm"] == "pre"
    ours = Translator.load(ours_dir, device="cpu", dtype="float32")
    theirs = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", compute_type="float32")
    sources = [[i for i in s[:-1] if i >= 4][:10] or [5] for s in SOURCES]  # no </s>: the file says so
    sources = [[min(i, 59) for i in s] for s in sources]
    expected = theirs.translate_batch([[vocab[i] for i in s] for s in sources], beam_size=1, max_decoding_length=20)
    got = ours.translate(sources, beam_size=1, max_length=20)
    assert [[vocab[i] for i in g.hypotheses[0].token_ids] for g in got] == [e.hypotheses[0] for e in expected]
    # the model computes what CTranslate2 computes: the log-probabilities of score_batch
    model, _, _ = load_checkpoint(ours_dir)
    targets = [[vocab[i] for i in g.hypotheses[0].token_ids][:8] for g in got]
    for source, target, scored in zip(sources, targets, theirs.score_batch([[vocab[i] for i in s] for s in sources],
                                                                           targets)):
        ids = [vocab.index(t) for t in target]
        with torch.no_grad():
            memory, mask = model.encode(torch.tensor([source]))
            logits, _ = model.decode(torch.tensor([[config.decoder_start_id] + ids]), memory, mask)
        log_probs = logits.log_softmax(-1)[0]
        assert [float(log_probs[k, t]) for k, t in enumerate(ids + [config.eos_id])] == \
            pytest.approx(scored.log_probs, abs=1e-4)
    # beam 4: the same best hypothesis for most; where a short finished hypothesis and a longer one are
    # close, our search (Hugging Face's stopping rule) and CTranslate2's can keep different ones
    expected = theirs.translate_batch([[vocab[i] for i in s] for s in sources], beam_size=4, max_decoding_length=20)
    got = ours.translate(sources, beam_size=4, max_length=20)
    same = sum([vocab[i] for i in g.hypotheses[0].token_ids] == e.hypotheses[0] for g, e in zip(got, expected))
    assert same >= len(sources) - 1
    assert ours.tokenizer.encode_source("Open the file.")[-1] != config.eos_id  # text gets no </s> either


def test_int8_weights_stay_the_files_int8_values(converted):
    """An int8 file's weights run on our int8 kernels as the very integers the file holds: both
    quantize each row symmetrically to its largest magnitude (CTranslate2's scale 127 / max |W|, our
    max |W| / 127), so requantizing what the reader dequantized gives back each value exactly."""
    from model.cpu.weights import Int8Linear, unpack_int8

    ct2_dir, ours_dir = converted["int8"]
    _, _, _, variables, _ = read_model_bin(ct2_dir / "model.bin")
    translator = Translator.load(ours_dir, device="cpu", dtype="int8")
    layers = dict(translator.model.named_modules())
    pairs = {"encoder_layers.0.ffn.w1": "encoder/layer_0/ffn/linear_0/weight",
             "decoder_layers.1.self_attn.qkv_proj": "decoder/layer_1/self_attention/linear_0/weight",
             "decoder_layers.0.cross_attn.kv_proj": "decoder/layer_0/attention/linear_1/weight"}
    for ours, theirs in pairs.items():
        layer = layers[ours]
        assert isinstance(layer, Int8Linear) and variables[theirs].dtype == torch.int8
        assert torch.equal(unpack_int8(layer.q, layer.out_features, layer.in_features), variables[theirs])
        assert torch.allclose(layer.scale, 1 / variables[f"{theirs}_scale"].float(), rtol=1e-6)


def test_a_trained_marian_model_decodes_as_ctranslate2_decodes(tmp_path, tokenizer_files):  # noqa: F811
    """A MarianMTModel trained for seconds to map each word to another (so that a wrong embedding scale,
    position table or vocabulary changes its output; random weights would hide such bugs), written
    by CTranslate2's TransformersConverter: ours decodes the file as CTranslate2 does."""
    from tests.test_marian_parity import EOS, assert_decodes_as_ctranslate2, mapping_words, train_mapping

    train_mapping(tmp_path / "hf", tokenizer_files)
    words = mapping_words(40)
    sources = [w + [EOS] for w in words]
    for quantization in ("float32", "int8"):  # int8: within one differing sentence in 40
        ct2_dir = tmp_path / f"ct2-{quantization}"
        ctranslate2.converters.TransformersConverter(str(tmp_path / "hf")).convert(
            str(ct2_dir), quantization=None if quantization == "float32" else quantization, force=True)
        ours_dir = import_ct2(ct2_dir, tmp_path / f"ours-{quantization}", tmp_path / "hf" / "source.spm")
        vocab = tokens(ct2_dir)
        theirs = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
        ours = Translator.load(ours_dir, device="cpu", dtype="float32")
        assert_decodes_as_ctranslate2(theirs, ours, vocab, [[vocab[i] for i in s] for s in sources], words,
                                      quantization)
