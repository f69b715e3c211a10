"""An Argos package's model as it is really made: an OpenNMT-py checkpoint (the dict CTranslate2's
OpenNMTPyConverter reads: `model`, `generator`, `opt`, `vocab`) converted by that converter, then
read by our CTranslate2 reader. The toy model has learned to reverse a sequence of words, so a
wrong reading of any flag (the embedding scale, the norm position, the position table, the
vocabulary order) changes its translations: ours must be CTranslate2's, token for token, greedy
and beam 4 in float32, and in int8 within one differing sentence in 40.

The same files as an Argos package (a folder, and an .argosmodel) are served through /translate,
/v1/translate, the English pivot and `nmt translate`, and each answer is CTranslate2's on the same
package.

Which test catches which misreading: `scale_embeddings` read as a factor of 1 (issue 45), or
`pre_norm`, or the position table, or the vocabulary's ids: test_decodes_as_ctranslate2_decodes
(every one changes most of the 40 reversals); the flag rule itself, including a float factor and
the older `multiply_by_sqrt_depth`: test_the_embedding_scale_follows_ctranslate2s_rule."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest
import torch

from app.settings import Settings
from model.config import ModelConfig
from model.convert.ctranslate2 import CT2Model, embedding_scale, import_ct2
from model.transformer import Transformer
from model.translator import Translator
from tests.conftest import ready_client, train_tiny_spm
from tests.test_ct2_import import interleaved_positions

ctranslate2 = pytest.importorskip("ctranslate2")

SPECIALS = ["<unk>", "<blank>", "<s>", "</s>"]  # OpenNMT-py's order
WORDS = [f"\u2581w{i}" for i in range(20)]  # SentencePiece's pieces of the words w0 ... w19
VOCAB = SPECIALS + WORDS
D_MODEL = 32


def reversal_batch(rng: random.Random, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources of 3-7 words (no </s>: OpenNMT-py adds none) and their reversals (<s> ... </s>)."""
    sources, targets = [], []
    for _ in range(size):
        words = [rng.randrange(4, len(VOCAB)) for _ in range(rng.randint(3, 7))]
        sources.append(words)
        targets.append([2] + words[::-1] + [3])
    pad = lambda rows: torch.tensor([r + [1] * (max(map(len, rows)) - len(r)) for r in rows])  # noqa: E731
    return pad(sources), pad(targets)


@pytest.fixture(scope="module")
def trained() -> Transformer:
    """An OpenNMT-py-shaped Transformer (pre-norm, ReLU, embeddings scaled by sqrt(d_model),
    OpenNMT-py's interleaved position table) trained for a few seconds to reverse its input."""
    torch.manual_seed(0)
    config = ModelConfig(src_vocab_size=len(VOCAB), tgt_vocab_size=len(VOCAB), d_model=D_MODEL, n_heads=4, d_ff=64,
                         encoder_layers=2, decoder_layers=2, norm="pre", activation="relu", share_embeddings=True,
                         dropout=0.0, max_positions=64, pad_id=1, unk_id=0, bos_id=2, eos_id=3, decoder_start_id=2,
                         source_eos=False, position_table=True, scale_embedding=True, output_bias=True)
    model = Transformer(config)
    with torch.no_grad():
        model.positions.copy_(interleaved_positions(64, D_MODEL))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    for _ in range(400):
        source, target = reversal_batch(rng, 64)
        memory, mask = model.encode(source)
        logits, _ = model.decode(target[:, :-1], memory, mask)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, len(VOCAB)), target[:, 1:].reshape(-1),
                                                 ignore_index=1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def opennmt_py_checkpoint(model: Transformer) -> dict:
    """The model under OpenNMT-py's names, as its trainer saves a checkpoint."""
    s = {k: v.detach().clone() for k, v in model.state_dict().items()}
    d = D_MODEL
    out = {}
    for side, layers, prefix in (("encoder", "encoder_layers", "encoder.transformer"),
                                 ("decoder", "decoder_layers", "decoder.transformer_layers")):
        out[f"{side}.embeddings.make_embedding.emb_luts.0.weight"] = s["src_embed.weight" if side == "encoder"
                                                                     else "tgt_embed.weight"]
        out[f"{side}.embeddings.make_embedding.pe.pe"] = s["positions"][:, None, :]  # (max_len, 1, d)
        out[f"{side}.layer_norm.weight"], out[f"{side}.layer_norm.bias"] = s[f"{side}_norm.weight"], s[f"{side}_norm.bias"]
        for i in range(2):
            ours, theirs = f"{layers}.{i}", f"{prefix}.{i}"
            q, k, v = s[f"{ours}.self_attn.qkv_proj.weight"].split(d)
            qb, kb, vb = s[f"{ours}.self_attn.qkv_proj.bias"].split(d)
            for name, w, b in (("linear_query", q, qb), ("linear_keys", k, kb), ("linear_values", v, vb),
                               ("final_linear", s[f"{ours}.self_attn.out_proj.weight"],
                                s[f"{ours}.self_attn.out_proj.bias"])):
                out[f"{theirs}.self_attn.{name}.weight"], out[f"{theirs}.self_attn.{name}.bias"] = w, b
            norms = ["layer_norm", "feed_forward.layer_norm"] if side == "encoder" else \
                ["layer_norm_1", "layer_norm_2", "feed_forward.layer_norm"]
            for j, name in enumerate(norms):
                out[f"{theirs}.{name}.weight"] = s[f"{ours}.sublayers.{j}.norm.weight"]
                out[f"{theirs}.{name}.bias"] = s[f"{ours}.sublayers.{j}.norm.bias"]
            for name, w in (("w_1", "w1"), ("w_2", "w2")):
                out[f"{theirs}.feed_forward.{name}.weight"] = s[f"{ours}.ffn.{w}.weight"]
                out[f"{theirs}.feed_forward.{name}.bias"] = s[f"{ours}.ffn.{w}.bias"]
            if side == "decoder":
                k, v = s[f"{ours}.cross_attn.kv_proj.weight"].split(d)
                kb, vb = s[f"{ours}.cross_attn.kv_proj.bias"].split(d)
                for name, w, b in (("linear_query", s[f"{ours}.cross_attn.q_proj.weight"],
                                    s[f"{ours}.cross_attn.q_proj.bias"]), ("linear_keys", k, kb),
                                   ("linear_values", v, vb),
                                   ("final_linear", s[f"{ours}.cross_attn.out_proj.weight"],
                                    s[f"{ours}.cross_attn.out_proj.bias"])):
                    out[f"{theirs}.context_attn.{name}.weight"], out[f"{theirs}.context_attn.{name}.bias"] = w, b
    opt = argparse.Namespace(encoder_type="transformer", decoder_type="transformer", enc_layers=2, dec_layers=2,
                             heads=4, position_encoding=True, max_relative_positions=0, pos_ffn_activation_fn="relu",
                             self_attn_type="scaled-dot", feat_merge="concat", lambda_align=0.0)
    generator = {"weight": s["output_proj.weight"], "bias": s["output_proj.bias"]}
    return {"model": out, "generator": generator, "opt": opt, "vocab": {"src": VOCAB, "tgt": VOCAB}}


@pytest.fixture(scope="module")
def converted(trained, tmp_path_factory):
    root = tmp_path_factory.mktemp("onmt")
    torch.save(opennmt_py_checkpoint(trained), root / "model.pt")
    out = {}
    for quantization in ("float32", "int8"):
        ct2_dir = root / f"ct2-{quantization}"
        ctranslate2.converters.OpenNMTPyConverter(str(root / "model.pt"), unsafe_deserialization=True).convert(
            str(ct2_dir), quantization=None if quantization == "float32" else quantization, force=True)
        ours = import_ct2(ct2_dir, root / f"ours-{quantization}", train_tiny_spm(root / "spm"))
        out[quantization] = (ct2_dir, ours)
    return out


def sentences(n: int = 40) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(4, len(VOCAB)) for _ in range(rng.randint(3, 7))] for _ in range(n)]


@pytest.mark.parametrize("quantization", ["float32", "int8"])
def test_decodes_as_ctranslate2_decodes(converted, quantization):
    ct2_dir, ours_dir = converted[quantization]
    theirs = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    ours = Translator.load(ours_dir, device="cpu", dtype="float32")
    sources = sentences()
    for beam in (1, 4):
        expected = [r.hypotheses[0] for r in theirs.translate_batch([[VOCAB[i] for i in s] for s in sources],
                                                                   beam_size=beam, max_decoding_length=12)]
        got = [[VOCAB[i] for i in r.hypotheses[0].token_ids]
               for r in ours.translate(sources, beam_size=beam, max_length=12)]
        differing = sum(g != e for g, e in zip(got, expected))
        assert differing <= (0 if quantization == "float32" else 1), (beam, differing, got[:3], expected[:3])
    learned = sum(e == [VOCAB[i] for i in s[::-1]] for e, s in zip(expected, sources))
    assert learned >= 30, f"the toy model reverses only {learned} of 40: a misreading would go unseen"


def test_the_embedding_scale_follows_ctranslate2s_rule():
    def model_with(variables: dict) -> CT2Model:
        return CT2Model(Path("m"), 6, "TransformerSpec", 7, variables)

    sqrt_d = 64 ** 0.5
    assert embedding_scale(model_with({"encoder/scale_embeddings": torch.tensor(1, dtype=torch.int8)}), "encoder",
                           64) == sqrt_d  # the flag True: sqrt(d_model), not 1
    assert embedding_scale(model_with({"encoder/scale_embeddings": torch.tensor(0, dtype=torch.int8)}), "encoder",
                           64) == 1.0
    assert embedding_scale(model_with({"decoder/scale_embeddings": torch.tensor(1.0)}), "decoder", 64) == 1.0
    assert embedding_scale(model_with({"decoder/scale_embeddings": torch.tensor(8.0)}), "decoder", 64) == 8.0
    old = {"encoder/embeddings/multiply_by_sqrt_depth": torch.tensor(1, dtype=torch.int8)}
    assert embedding_scale(model_with(old), "encoder", 64) == sqrt_d
    assert embedding_scale(model_with({}), "encoder", 64) == sqrt_d  # neither variable: scaled


# --- the same model as an Argos package, through the service ------------------------------------

def word_spm(path: Path) -> Path:
    """A SentencePiece word model whose pieces are the toy's words, as an Argos package carries one."""
    import io

    import sentencepiece as spm

    rng = random.Random(0)
    lines = [" ".join(f"w{rng.randrange(20)}" for _ in range(6)) for _ in range(2000)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, model_type="word",
                                   vocab_size=23, character_coverage=1.0, minloglevel=2)
    path.write_bytes(model.getvalue())
    return path


def argos_package(root: Path, ct2_dir: Path, spm_path: Path, from_code: str, to_code: str) -> Path:
    import json
    import shutil

    package = root / f"translate-{from_code}_{to_code}-1_0"
    shutil.copytree(ct2_dir, package / "model")
    shutil.copy(spm_path, package / "sentencepiece.model")
    names = {"en": "English", "de": "German", "fr": "French"}
    (package / "metadata.json").write_text(json.dumps({
        "package_version": "1.0", "argos_version": "1.9", "from_code": from_code, "from_name": names[from_code],
        "to_code": to_code, "to_name": names[to_code]}))
    return package


@pytest.fixture(scope="module")
def packages(converted, tmp_path_factory):
    """fr->en and en->de, both the reversing model: fr->de through English gives the text back."""
    root = tmp_path_factory.mktemp("argos")
    spm_path = word_spm(root / "words.model")
    ct2_dir = converted["float32"][0]
    folder = root / "packages"
    return folder, [argos_package(folder, ct2_dir, spm_path, *pair) for pair in (("fr", "en"), ("en", "de"))], spm_path


def ct2_translate(ct2_dir: Path, spm_path: Path, texts: list[str], beam: int) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    results = translator.translate_batch([sp.encode(t, out_type=str) for t in texts], beam_size=beam,
                                         max_decoding_length=12)
    return [sp.decode(r.hypotheses[0]) for r in results]


def texts(n: int = 40) -> list[str]:
    return [" ".join(VOCAB[i][1:] for i in s) for s in sentences(n)]


def test_the_service_translates_an_argos_package_as_ctranslate2_does(packages, tmp_path):
    folder, (fr_en, en_de), spm_path = packages
    settings = Settings(model_dirs=[str(folder)], model_cache=str(tmp_path / "cache"), workers=1,
                        threads_per_worker=1, max_wait_ms=2, dtype="float32", detect_languages=["none"], cache=False)
    sources = texts()
    with ready_client(settings) as client:
        for beam in (1, 4):
            expected = ct2_translate(en_de / "model", spm_path, sources, beam)
            v1 = client.post("/v1/translate", json={"text": sources, "source": "en", "target": "de",
                                                    "beam_size": beam, "max_length": 12})
            assert [t["text"] for t in v1.json()["translations"]] == expected, beam
            # the pivot: fr -> en -> de, each leg as CTranslate2 translates it
            middle = ct2_translate(fr_en / "model", spm_path, sources, beam)
            through = ct2_translate(en_de / "model", spm_path, middle, beam)
            pivot = client.post("/v1/translate", json={"text": sources, "source": "fr", "target": "de",
                                                       "beam_size": beam, "max_length": 12}).json()
            assert pivot["pivot"] == "en" and [t["text"] for t in pivot["translations"]] == through, beam
        lt = client.post("/translate", json={"q": sources, "source": "en", "target": "de"})  # beam 4
        assert lt.json()["translatedText"] == ct2_translate(en_de / "model", spm_path, sources, 4)
        lt_pivot = client.post("/translate", json={"q": sources[:8], "source": "fr", "target": "de"})
        middle = ct2_translate(fr_en / "model", spm_path, sources[:8], 4)
        assert lt_pivot.json()["translatedText"] == ct2_translate(en_de / "model", spm_path, middle, 4)
    reversed_back = sum(t == s for t, s in zip(through, sources))
    assert reversed_back >= 30  # reversed twice: the text itself, for most
    # `nmt translate` on the checkpoint the service converted the package into
    import subprocess
    import sys

    served = next(m.parent for m in (tmp_path / "cache").rglob("metadata.json")
                  if '"target_lang": "de"' in m.read_text())
    cli = subprocess.run([sys.executable, "-m", "nmt", "translate", "--model", str(served), "--beam", "4",
                          "--dtype", "float32", "--max-length", "12"], input="\n".join(sources) + "\n",
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == ct2_translate(en_de / "model", spm_path, sources, 4)


def test_an_argosmodel_file_translates_as_its_folder_does(packages, tmp_path):
    import zipfile

    _, (_, en_de), spm_path = packages
    archive = tmp_path / "translate-en_de-1_0.argosmodel"
    with zipfile.ZipFile(archive, "w") as z:
        for path in en_de.rglob("*"):
            z.write(path, path.relative_to(en_de.parent))
    settings = Settings(model_dirs=[str(archive)], model_cache=str(tmp_path / "cache"), workers=1,
                        threads_per_worker=1, max_wait_ms=2, dtype="float32", detect_languages=["none"], cache=False)
    sources = texts(8)
    with ready_client(settings) as client:
        got = client.post("/v1/translate", json={"text": sources, "source": "en", "target": "de", "beam_size": 4,
                                                 "max_length": 12}).json()
    assert [t["text"] for t in got["translations"]] == ct2_translate(en_de / "model", spm_path, sources, 4)
