"""Marian release folders (model/convert/marian_npz.py): folders written here in Marian's layout
(decoder.yml, an .npz with special:model.yml, .yml vocabularies, source.spm/target.spm, README.md)
are read by CTranslate2's own Marian converter and by ours; both decode the same tokens, greedy and
beam 4, with the same log-probabilities, for post-norm and pre-norm, shared and separate
vocabularies. Without a trained table, positions are Marian's own sinusoids; what we do not
compute is refused by name; NMT_MODEL_DIRS takes a release folder as it is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from model.checkpoint import load_checkpoint
from model.convert.argos import checkpoints
from model.convert.marian_npz import MarianNpzError, import_marian_npz, marian_positions, read_vocab
from model.transformer import sinusoidal_positions
from model.translator import Translator
from tests.test_marian_parity import SOURCES, tokenizer_files  # noqa: F401 (a fixture)

ctranslate2 = pytest.importorskip("ctranslate2")

D, HEADS, FFN, LAYERS = 32, 4, 64, 2


def pieces(vocab: dict[str, int]) -> list[str]:
    """Marian's vocabulary from one of tokenizer_files' (</s> 0, <unk> 1, the pieces; no <pad>)."""
    return [p for p, _ in sorted(vocab.items(), key=lambda item: item[1]) if p != "<pad>"]


def write_vocab(path: Path, tokens: list[str]) -> None:
    path.write_text("".join(f"{json.dumps(t, ensure_ascii=False)}: {i}\n" for i, t in enumerate(tokens)),
                    encoding="utf-8")


def write_release(folder: Path, tokenizer_files, pre_norm: bool = False, shared: bool = True, wpos: bool = True,  # noqa: F811
                  seed: int = 0, options: dict | None = None, readme: str = "* source language(s): eng\n"
                  "* target language(s): deu\n") -> tuple[list[str], list[str]]:
    """A random model in Marian's release layout; returns the source and target pieces."""
    rng = np.random.default_rng(seed)
    src = pieces(tokenizer_files["src"][1])
    tgt = src if shared else pieces(tokenizer_files["tgt"][1])
    ln = "_pre" if pre_norm else ""

    def normal(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    if shared:
        w["Wemb"] = normal(len(src), D)
    else:
        w["encoder_Wemb"], w["decoder_Wemb"] = normal(len(src), D), normal(len(tgt), D)

    def attention(scope):
        for p in "qkvo":
            w[f"{scope}_W{p}"], w[f"{scope}_b{p}"] = normal(D, D), normal(1, D, scale=0.05)
        w[f"{scope}_Wo_ln_scale{ln}"], w[f"{scope}_Wo_ln_bias{ln}"] = 1 + normal(1, D, scale=0.1), normal(1, D, scale=0.1)

    for side in ("encoder", "decoder"):
        for i in range(1, LAYERS + 1):
            attention(f"{side}_l{i}_self")
            if side == "decoder":
                attention(f"{side}_l{i}_context")
            scope = f"{side}_l{i}_ffn"
            w[f"{scope}_W1"], w[f"{scope}_b1"] = normal(D, FFN), normal(1, FFN, scale=0.05)
            w[f"{scope}_W2"], w[f"{scope}_b2"] = normal(FFN, D), normal(1, D, scale=0.05)
            w[f"{scope}_ffn_ln_scale{ln}"], w[f"{scope}_ffn_ln_bias{ln}"] = 1 + normal(1, D, scale=0.1), normal(1, D, scale=0.1)
        if pre_norm:
            w[f"{side}_top_ln_scale"], w[f"{side}_top_ln_bias"] = 1 + normal(1, D, scale=0.1), normal(1, D, scale=0.1)
    bias = normal(1, len(tgt), scale=0.5)
    bias[0, 0] = -2.0  # </s>: hypotheses of a few tokens, not one
    w["decoder_ff_logit_out_b"] = bias
    if wpos:  # Marian's own sinusoids, stored: CTranslate2 then reads the table ours computes
        w["Wpos"] = marian_positions(64, D).numpy()
    model_yml = {"type": "transformer", "dim-emb": D, "dim-vocabs": [len(src), len(tgt)], "enc-depth": LAYERS,
                 "dec-depth": LAYERS, "transformer-heads": HEADS, "transformer-dim-ffn": FFN,
                 "transformer-ffn-activation": "swish", "transformer-decoder-autoreg": "self-attention",
                 "transformer-preprocess": "n" if pre_norm else "", "transformer-postprocess": "da" if pre_norm else "dan",
                 "transformer-postprocess-top": "n" if pre_norm else "", "transformer-postprocess-emb": "d",
                 "transformer-guided-alignment-layer": "last", "transformer-no-projection": False,
                 "tied-embeddings-all": shared, "tied-embeddings": True, **(options or {})}
    w["special:model.yml"] = np.frombuffer(yaml.safe_dump(model_yml).encode() + b"\0", dtype=np.int8)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "opus.spm32k-spm32k.transformer-align.model1.npz.best-perplexity.npz", **w)
    vocabs = ["opus.spm32k-spm32k.vocab.yml"] * 2 if shared else ["opus.src.vocab.yml", "opus.trg.vocab.yml"]
    write_vocab(folder / vocabs[0], src)
    write_vocab(folder / vocabs[1], tgt)
    (folder / "decoder.yml").write_text(yaml.safe_dump({
        "models": ["opus.spm32k-spm32k.transformer-align.model1.npz.best-perplexity.npz"], "vocabs": vocabs,
        "beam-size": 6, "normalize": 1, "word-penalty": 0, "mini-batch": 16, "maxi-batch": 100}))
    (folder / "source.spm").write_bytes(Path(tokenizer_files["src"][0]).read_bytes())
    (folder / "target.spm").write_bytes(Path(tokenizer_files["src" if shared else "tgt"][0]).read_bytes())
    (folder / "README.md").write_text(f"# opus-2020-02-26.zip\n\n* dataset: opus\n* model: transformer-align\n{readme}")
    return src, tgt


VARIANTS = {"post-norm, shared": dict(pre_norm=False, shared=True), "pre-norm, separate": dict(pre_norm=True, shared=False)}


@pytest.fixture(scope="module")
def releases(tmp_path_factory, tokenizer_files):  # noqa: F811
    out = {}
    for name, kwargs in VARIANTS.items():
        root = tmp_path_factory.mktemp(name.replace(", ", "-"))
        src, tgt = write_release(root / "release", tokenizer_files, **kwargs)
        decoder = yaml.safe_load((root / "release" / "decoder.yml").read_text())
        ctranslate2.converters.MarianConverter(str(root / "release" / decoder["models"][0]),
                                               [str(root / "release" / v) for v in decoder["vocabs"]]).convert(
            str(root / "ct2"), force=True)
        out[name] = (root / "ct2", import_marian_npz(root / "release", root / "ours"), src, tgt)
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decodes_token_for_token_what_ctranslate2_decodes(releases, variant):
    ct2_dir, ours_dir, src, tgt = releases[variant]
    theirs = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    ours = Translator.load(ours_dir, device="cpu", dtype="float32")
    for beam in (1, 4):
        expected = theirs.translate_batch([[src[i] for i in s[:-1]] for s in SOURCES], beam_size=beam,
                                          max_decoding_length=20, return_scores=True)
        got = ours.translate(SOURCES, beam_size=beam, max_length=20)
        for e, g in zip(expected, got):
            assert [tgt[i] for i in g.hypotheses[0].token_ids] == e.hypotheses[0]
    assert len({tuple(r.hypotheses[0].token_ids) for r in got}) > 1  # outputs that tell the inputs apart


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_log_probabilities_match_score_batch(releases, variant):
    ct2_dir, ours_dir, src, tgt = releases[variant]
    theirs = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    model, _, _ = load_checkpoint(ours_dir)
    c = model.config
    targets = [[(i * 7 + k) % (len(tgt) - 2) + 2 for k in range(6)] for i in range(len(SOURCES))]
    scored = theirs.score_batch([[src[i] for i in s[:-1]] for s in SOURCES], [[tgt[i] for i in t] for t in targets])
    for source, target, expected in zip(SOURCES, targets, scored):
        with torch.no_grad():
            memory, mask = model.encode(torch.tensor([source]))
            logits, _ = model.decode(torch.tensor([[c.decoder_start_id] + target]), memory, mask)
        log_probs = logits.log_softmax(-1)[0]
        assert [float(log_probs[k, t]) for k, t in enumerate(target + [c.eos_id])] == pytest.approx(
            expected.log_probs, abs=1e-4)


def test_the_languages_and_the_origin_come_from_the_release(releases):
    _, ours_dir, _, _ = releases["post-norm, shared"]
    meta = json.loads((ours_dir / "metadata.json").read_text())
    assert (meta["source_lang"], meta["target_lang"]) == ("en", "de")
    assert meta["imported_from"]["format"] == "marian-npz"
    assert meta["imported_from"]["model_yml"]["transformer-ffn-activation"] == "swish"


def test_without_a_trained_table_the_positions_are_marians_sinusoids(tmp_path, tokenizer_files):  # noqa: F811
    write_release(tmp_path / "release", tokenizer_files, wpos=False)
    model, _, _ = load_checkpoint(import_marian_npz(tmp_path / "release", tmp_path / "ours"))
    table = model.positions  # (max_positions, d)
    # marian-dev src/graph/node_initializers.cpp, written out: timescale i of d/2 is 10000^(i / (d/2 - 1))
    half = D // 2
    for p in (0, 1, 7, 300):
        for i in (0, 1, 5, half - 1):
            angle = p * np.exp(i * -np.log(10000.0) / (half - 1))
            assert float(table[p, i]) == pytest.approx(np.sin(angle), abs=1e-5)
            assert float(table[p, half + i]) == pytest.approx(np.cos(angle), abs=1e-5)
    # not the d/2 table of Hugging Face's and CTranslate2's conversions
    assert (table - sinusoidal_positions(table.shape[0], D)).abs().max() > 0.5


@pytest.mark.parametrize("options, named", [
    ({"transformer-ffn-activation": "gelu"}, "GELU"),
    ({"transformer-decoder-autoreg": "average-attention"}, "average-attention"),
    ({"transformer-postprocess-emb": "dn"}, "LayerNorm on the embeddings"),
    ({"right-left": True}, "right-to-left"),
    ({"transformer-tied-layers": [1, 1]}, "tied layers"),
    ({"type": "s2s"}, "model type 's2s'"),
])
def test_what_we_do_not_compute_is_refused_by_name(tmp_path, tokenizer_files, options, named):  # noqa: F811
    write_release(tmp_path / "release", tokenizer_files, options=options)
    with pytest.raises(MarianNpzError, match=named):
        import_marian_npz(tmp_path / "release", tmp_path / "ours")


def test_unused_tensors_missing_languages_and_multilingual_models_are_refused(tmp_path, tokenizer_files):  # noqa: F811
    folder = tmp_path / "release"
    write_release(folder, tokenizer_files)
    npz = next(folder.glob("*.npz"))
    with np.load(npz) as f:
        weights = {n: f[n] for n in f.files}
    np.savez(npz, **weights, encoder_emb_ln_scale_pre=np.ones((1, D), np.float32))
    with pytest.raises(MarianNpzError, match="encoder_emb_ln_scale_pre"):
        import_marian_npz(folder, tmp_path / "a")

    write_release(folder, tokenizer_files, readme="* source language(s): eng\n* target language(s): deu nld\n")
    with pytest.raises(MarianNpzError, match="--source xx --target yy"):
        import_marian_npz(folder, tmp_path / "b")
    assert import_marian_npz(folder, tmp_path / "c", "en", "nl").is_dir()

    decoder = yaml.safe_load((folder / "decoder.yml").read_text())
    (folder / "decoder.yml").write_text(yaml.safe_dump({**decoder, "models": ["../elsewhere.npz"]}))
    with pytest.raises(MarianNpzError, match="outside the folder"):
        import_marian_npz(folder, tmp_path / "e", "en", "nl")
    (folder / "decoder.yml").write_text(yaml.safe_dump(decoder))

    vocab = folder / "opus.spm32k-spm32k.vocab.yml"
    write_vocab(vocab, pieces(tokenizer_files["src"][1])[:-1] + [">>nld<<"])
    with pytest.raises(MarianNpzError, match="multilingual"):
        import_marian_npz(folder, tmp_path / "d", "en", "nl")


def test_vocabulary_keys_are_read_as_the_strings_they_spell(tmp_path):
    path = tmp_path / "vocab.yml"
    path.write_text('"</s>": 0\n<unk>: 1\nyes: 2\nnull: 3\n"12": 4\n\'it\'\'s\': 5\n"\\"": 6\n? "a: b"\n: 7\n▁Haus: 8\n',
                    encoding="utf-8")
    assert read_vocab(path) == {"</s>": 0, "<unk>": 1, "yes": 2, "null": 3, "12": 4, "it's": 5, '"': 6, "a: b": 7,
                                "▁Haus": 8}
    path.write_text('"</s>": 0\n<unk>: 1\nfoo: 3\n', encoding="utf-8")
    with pytest.raises(MarianNpzError, match="0..2"):
        read_vocab(path)


def test_nmt_model_dirs_takes_a_release_folder(tmp_path, tokenizer_files):  # noqa: F811
    write_release(tmp_path / "release", tokenizer_files)
    first = checkpoints([str(tmp_path / "release")], tmp_path / "cache")
    again = checkpoints([str(tmp_path / "release")], tmp_path / "cache")
    assert first == again and json.loads((first[0] / "metadata.json").read_text())["target_lang"] == "de"
    translator = Translator.load(first[0], device="cpu", dtype="float32")
    assert translator.translate(["Hello world."])[0].hypotheses[0].token_ids


def write_trained_release(folder: Path, hf, tokenizer_files) -> list[str]:  # noqa: F811
    """train_mapping's model in Marian's release layout (post-norm, shared vocabulary, Swish): HF's
    names mapped back onto Marian's, as Marian itself would have saved the model."""
    s = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    vocab = pieces(tokenizer_files["src"][1])  # HF's vocabulary less its appended <pad>
    row = lambda a: a[None, :].astype(np.float32)  # noqa: E731 (Marian keeps vectors as 1 x n)
    w = {"Wemb": s["model.shared.weight"][:len(vocab)], "Wpos": marian_positions(64, D).numpy(),
         "decoder_ff_logit_out_b": s["final_logits_bias"][:, :len(vocab)]}

    def attention(scope: str, hf_scope: str, norm: str):
        for p, name in zip("qkvo", ("q_proj", "k_proj", "v_proj", "out_proj")):
            w[f"{scope}_W{p}"], w[f"{scope}_b{p}"] = s[f"{hf_scope}.{name}.weight"].T, row(s[f"{hf_scope}.{name}.bias"])
        w[f"{scope}_Wo_ln_scale"], w[f"{scope}_Wo_ln_bias"] = row(s[f"{norm}.weight"]), row(s[f"{norm}.bias"])

    for side in ("encoder", "decoder"):
        for i in range(1, LAYERS + 1):
            layer = f"model.{side}.layers.{i - 1}"
            attention(f"{side}_l{i}_self", f"{layer}.self_attn", f"{layer}.self_attn_layer_norm")
            if side == "decoder":
                attention(f"{side}_l{i}_context", f"{layer}.encoder_attn", f"{layer}.encoder_attn_layer_norm")
            ffn = f"{side}_l{i}_ffn"
            w[f"{ffn}_W1"], w[f"{ffn}_b1"] = s[f"{layer}.fc1.weight"].T, row(s[f"{layer}.fc1.bias"])
            w[f"{ffn}_W2"], w[f"{ffn}_b2"] = s[f"{layer}.fc2.weight"].T, row(s[f"{layer}.fc2.bias"])
            w[f"{ffn}_ffn_ln_scale"] = row(s[f"{layer}.final_layer_norm.weight"])
            w[f"{ffn}_ffn_ln_bias"] = row(s[f"{layer}.final_layer_norm.bias"])
    model_yml = {"type": "transformer", "dim-emb": D, "dim-vocabs": [len(vocab)] * 2, "enc-depth": LAYERS,
                 "dec-depth": LAYERS, "transformer-heads": HEADS, "transformer-dim-ffn": FFN,
                 "transformer-ffn-activation": "swish", "transformer-decoder-autoreg": "self-attention",
                 "transformer-preprocess": "", "transformer-postprocess": "dan", "transformer-postprocess-top": "",
                 "transformer-postprocess-emb": "d", "transformer-no-projection": False,
                 "transformer-guided-alignment-layer": "last", "tied-embeddings-all": True, "tied-embeddings": True}
    w["special:model.yml"] = np.frombuffer(yaml.safe_dump(model_yml).encode() + b"\0", dtype=np.int8)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "model.npz", **{k: np.ascontiguousarray(v, dtype=v.dtype) for k, v in w.items()})
    write_vocab(folder / "vocab.yml", vocab)
    (folder / "decoder.yml").write_text(yaml.safe_dump({"models": ["model.npz"], "vocabs": ["vocab.yml"] * 2,
                                                        "beam-size": 4, "normalize": 1}))
    (folder / "source.spm").write_bytes(Path(tokenizer_files["src"][0]).read_bytes())
    (folder / "target.spm").write_bytes(Path(tokenizer_files["src"][0]).read_bytes())
    (folder / "README.md").write_text("# opus\n\n* source language(s): eng\n* target language(s): deu\n")
    return vocab


def test_a_trained_release_decodes_as_ctranslate2s_marian_converter_reads_it(tmp_path, tokenizer_files):  # noqa: F811
    """A model that learned a word mapping, saved as a Marian release and converted by CTranslate2's
    MarianConverter: ours reads the release and decodes as CTranslate2 decodes its conversion,
    greedy and beam 4 in float32, int8 within 4 sentences in 40 (assert_decodes_as_ctranslate2)."""
    from tests.test_marian_parity import assert_decodes_as_ctranslate2, mapping_words, train_mapping

    hf = train_mapping(tmp_path / "hf", tokenizer_files)
    vocab = write_trained_release(tmp_path / "release", hf, tokenizer_files)
    ours_dir = import_marian_npz(tmp_path / "release", tmp_path / "ours")
    words = mapping_words(40)
    for quantization in ("float32", "int8"):
        ct2_dir = tmp_path / f"ct2-{quantization}"
        ctranslate2.converters.MarianConverter(str(tmp_path / "release" / "model.npz"),
                                               [str(tmp_path / "release" / "vocab.yml")] * 2).convert(
            str(ct2_dir), quantization=None if quantization == "float32" else quantization, force=True)
        theirs = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
        ours = Translator.load(ours_dir, device="cpu", dtype="float32" if quantization == "float32" else "int8")
        assert_decodes_as_ctranslate2(theirs, ours, vocab, [[vocab[i] for i in w] for w in words], words, quantization)
