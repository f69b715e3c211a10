"""Marian release folders (OPUS-MT-train and Tatoeba-Challenge zips) as our checkpoints.

    nmt import-marian path/to/opus-2020-02-26 OUT_DIR [--source en --target de]

A release folder holds `decoder.yml` (`models`: the `.npz`, `vocabs`: source and target `.yml`
vocabularies), `source.spm`, `target.spm` and a `README.md` naming the languages. The `.npz` is
read with numpy without pickles; its `special:model.yml` entry (YAML, NUL-terminated) gives the
architecture. How Marian's transformer maps onto `model.transformer.Transformer`:

* embeddings times sqrt(d_model) plus Marian's sinusoids from position 0 on both sides. Marian's
  table divides the log-timescale range by (d/2 - 1) where ours (and Hugging Face's and
  CTranslate2's conversions) divide by d/2, so the table is stored with the weights
  (`position_table`); a trained table (`Wpos`) is stored the same way;
* decoding starts from a zero vector, not a token: an extra target row that embeds to zeros and
  is never written (CTranslate2's reader does the same, `ctranslate2.ZERO_START`), which also
  pads; `</s>` ends every source;
* post-norm (`--transformer-preprocess '' --transformer-postprocess dan`) or pre-norm (`n`, `da`,
  top `n`) layers; Marian's `W` matrices are [in, out] (ours [out, in]), biases and norms [1, d];
  `Wemb` shared by everything, or `encoder_Wemb` / `decoder_Wemb`; the output layer tied to the
  decoder embedding unless `decoder_ff_logit_out_W` (or `_Wt`) is there, with its bias `_b`.

Layer norms use our epsilon (1e-5; Marian trained with 1e-6, as CTranslate2's conversion also
ignores). What Marian can compute and we cannot (its GELU, which is x * sigmoid(1.702 x), average
attention, a LayerNorm on the embeddings, tied layers, right-to-left decoders, multilingual
target-language tokens) is refused by name. Every tensor of the file must be used.
"""

from __future__ import annotations

import dataclasses
import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from model.checkpoint import DTYPES, save_checkpoint, stored_state
from model.config import ModelConfig
from model.convert import check_mapping
from model.convert.ctranslate2 import ZERO_START, with_zero_start
from model.transformer import Transformer

# a sequence longer than this many tokens has no position: far above the Translator's caps
MAX_POSITIONS = 1024
ACTIVATIONS = {"swish": "swish", "relu": "relu"}
_Loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # every scalar a string: `yes: 12` is the piece "yes"

# ISO 639-3 codes of release READMEs -> the ISO 639-1 codes this service speaks
ISO_639_3 = {
    "afr": "af", "ara": "ar", "bul": "bg", "cat": "ca", "ces": "cs", "cym": "cy", "dan": "da", "deu": "de",
    "ell": "el", "eng": "en", "epo": "eo", "est": "et", "eus": "eu", "fas": "fa", "fin": "fi", "fra": "fr",
    "gle": "ga", "glg": "gl", "heb": "he", "hin": "hi", "hrv": "hr", "hun": "hu", "ind": "id", "isl": "is",
    "ita": "it", "jpn": "ja", "kor": "ko", "lav": "lv", "lit": "lt", "mkd": "mk", "nld": "nl", "nob": "nb",
    "nor": "no", "pol": "pl", "por": "pt", "ron": "ro", "rus": "ru", "slk": "sk", "slv": "sl", "spa": "es",
    "sqi": "sq", "srp": "sr", "swe": "sv", "tha": "th", "tur": "tr", "ukr": "uk", "vie": "vi", "zho": "zh",
}


class MarianNpzError(ValueError):
    pass


@dataclass
class Release:
    folder: Path
    npz: Path
    options: dict  # special:model.yml
    weights: dict[str, np.ndarray]
    source_vocab: dict[str, int]
    target_vocab: dict[str, int]
    source_spm: Path
    target_spm: Path


def is_release(path: Path) -> bool:
    return (path / "decoder.yml").is_file() and any(path.glob("*.npz"))


def read_vocab(path: Path) -> dict[str, int]:
    """A Marian `.yml` vocabulary (piece: id), every key read as the string it spells."""
    try:
        vocab = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise MarianNpzError(f"{path}: not a YAML vocabulary ({e})") from e
    if not isinstance(vocab, dict) or not all(isinstance(v, str) and v.isdigit() for v in vocab.values()):
        raise MarianNpzError(f"{path}: expected a mapping piece -> integer id")
    ids = {piece: int(i) for piece, i in vocab.items()}
    if sorted(ids.values()) != list(range(len(ids))):
        raise MarianNpzError(f"{path}: ids are not 0..{len(ids) - 1}, each once")
    for piece, expected in (("</s>", 0), ("<unk>", 1)):
        if ids.get(piece) != expected:
            raise MarianNpzError(f"{path}: {piece} must have id {expected} (Marian's), has {ids.get(piece)}")
    return ids


def read_release(folder: str | Path) -> Release:
    folder = Path(folder)
    if not (folder / "decoder.yml").is_file():
        raise MarianNpzError(f"{folder}: no decoder.yml (not a Marian release folder)")
    decoder = yaml.safe_load((folder / "decoder.yml").read_text(encoding="utf-8")) or {}
    models, vocabs = decoder.get("models") or [], decoder.get("vocabs") or []
    if len(models) != 1:
        raise MarianNpzError(f"{folder / 'decoder.yml'}: {len(models)} models; one expected (ensembles are not "
                             "supported)")
    if len(vocabs) != 2:
        raise MarianNpzError(f"{folder / 'decoder.yml'}: {len(vocabs)} vocabularies; a source and a target expected")
    outside = [name for name in models + vocabs if not (folder / str(name)).resolve().is_relative_to(folder.resolve())]
    if outside:
        raise MarianNpzError(f"{folder / 'decoder.yml'}: {', '.join(map(str, outside))} lies outside the folder")
    npz = folder / models[0]
    try:
        with np.load(npz, allow_pickle=False) as f:  # object arrays (pickles) are refused by numpy
            weights = {name: f[name] for name in f.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise MarianNpzError(f"{npz}: unreadable ({e})") from e
    if "special:model.yml" not in weights:
        raise MarianNpzError(f"{npz}: no special:model.yml (the architecture)")
    text = weights.pop("special:model.yml").tobytes().split(b"\0", 1)[0].decode("utf-8")
    options = yaml.safe_load(text) or {}
    spms = [folder / name for name in ("source.spm", "target.spm")]
    missing = [p.name for p in spms if not p.is_file()]
    if missing:
        raise MarianNpzError(f"{folder}: missing {', '.join(missing)} (SentencePiece models; BPE releases are "
                             "not supported)")
    return Release(folder, npz, options, weights, read_vocab(folder / vocabs[0]), read_vocab(folder / vocabs[1]),
                   *spms)


def refusals(o: dict) -> list[str]:
    """What the model.yml asks for that our model does not compute."""
    problems = []
    if o.get("type", "transformer") != "transformer":
        problems.append(f"model type {o.get('type')!r} (only 'transformer')")
    if o.get("transformer-decoder-autoreg", "self-attention") != "self-attention":
        problems.append(f"a decoder with {o['transformer-decoder-autoreg']} instead of self-attention")
    if o.get("transformer-ffn-activation", "swish") not in ACTIVATIONS:
        act = o["transformer-ffn-activation"]
        problems.append("Marian's GELU (x * sigmoid(1.702 x))" if act == "gelu" else f"the activation {act!r}")
    if "n" in str(o.get("transformer-postprocess-emb", "d")):
        problems.append("a LayerNorm on the embeddings (--transformer-postprocess-emb n)")
    layout = (o.get("transformer-preprocess", ""), o.get("transformer-postprocess", "dan"),
              o.get("transformer-postprocess-top", ""))
    if layout not in (("", "dan", ""), ("n", "da", "n")):
        problems.append(f"the layer layout preprocess={layout[0]!r} postprocess={layout[1]!r} top={layout[2]!r} "
                        "(post-norm '', 'dan', '' or pre-norm 'n', 'da', 'n')")
    for key, default in (("transformer-ffn-depth", 2), ("transformer-decoder-ffn-depth", 0)):
        if int(o.get(key, default) or 0) not in (0, 2):
            problems.append(f"{key} {o[key]} (two-layer FFNs only)")
    if o.get("transformer-tied-layers"):
        problems.append("tied layers (--transformer-tied-layers)")
    if o.get("right-left"):
        problems.append("a right-to-left decoder")
    if o.get("transformer-no-projection"):
        problems.append("attention without its output projection")
    if any(o.get(k) for k in ("factors-dim-emb", "lemma-dim-emb")):
        problems.append("factored vocabularies")
    return problems


def marian_positions(n: int, d: int) -> torch.Tensor:
    """Marian's sinusoids (src/graph/node_initializers.cpp): position p, channel i < d/2 gets
    sin(p * 10000^(-i / (d/2 - 1))), channel d/2 + i the cosine."""
    half = d // 2
    inverse = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / (half - 1)))  # (d/2,)
    angles = torch.arange(n, dtype=torch.float32)[:, None] * inverse[None, :]  # (n, d/2)
    return torch.cat([angles.sin(), angles.cos()], dim=1)  # (n, d)


def our_config(r: Release) -> ModelConfig:
    o, w = r.options, r.weights
    problems = refusals(o)
    embedding = "Wemb" if "Wemb" in w else "encoder_Wemb"
    if embedding not in w or ("Wemb" not in w and "decoder_Wemb" not in w):
        problems.append("no Wemb (nor encoder_Wemb and decoder_Wemb)")
    if "encoder_l1_ffn_W1" not in w:
        problems.append("no encoder_l1_ffn_W1 (not a transformer's tensors)")
    if problems:
        raise MarianNpzError(f"{r.npz}: not supported: " + "; ".join(problems))
    d_model = int(w[embedding].shape[1])
    heads = int(o.get("transformer-heads", 8))
    if d_model % heads or d_model % 2:
        raise MarianNpzError(f"{r.npz}: d_model {d_model} with {heads} heads")
    encoder_layers = len({m[1] for n in w if (m := re.match(r"encoder_l(\d+)_", n))})
    decoder_layers = len({m[1] for n in w if (m := re.match(r"decoder_l(\d+)_", n))})
    share = "Wemb" in w and r.source_vocab == r.target_vocab
    zero_start = len(r.target_vocab)  # the appended row: decoding starts from it, and it pads
    positions = min(MAX_POSITIONS, int(w["Wpos"].shape[0])) if "Wpos" in w else MAX_POSITIONS
    return ModelConfig(
        src_vocab_size=len(r.source_vocab) + (1 if share else 0), tgt_vocab_size=len(r.target_vocab) + 1,
        d_model=d_model, n_heads=heads, d_ff=int(w["encoder_l1_ffn_W1"].shape[1]), encoder_layers=encoder_layers,
        decoder_layers=decoder_layers, norm="pre" if o.get("transformer-preprocess") == "n" else "post",
        activation=ACTIVATIONS[o.get("transformer-ffn-activation", "swish")], share_embeddings=share,
        tie_output=False, output_bias=True, scale_embedding=True, dropout=0.0, max_positions=positions,
        pad_id=zero_start, bos_id=zero_start, eos_id=r.target_vocab["</s>"], unk_id=r.target_vocab["<unk>"],
        decoder_start_id=zero_start, source_eos=True, position_table=True)


def weight_plan(c: ModelConfig) -> dict[str, tuple[list[str], bool]]:
    """Our tensor name -> (Marian names concatenated along our dim 0, whether each is transposed).
    Vocabulary matrices and positions are resolved in `convert_weights`."""
    plan: dict[str, tuple[list[str], bool]] = {}
    ln = "_pre" if c.norm == "pre" else ""

    def linear(ours: str, scope: str, suffixes: str):
        plan[f"{ours}.weight"] = ([f"{scope}_W{s}" for s in suffixes], True)
        plan[f"{ours}.bias"] = ([f"{scope}_b{s}" for s in suffixes], False)

    def norm(ours: str, scope: str):
        plan[f"{ours}.weight"], plan[f"{ours}.bias"] = ([f"{scope}_ln_scale{ln}"], False), ([f"{scope}_ln_bias{ln}"], False)

    for side, layers in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
        for i in range(layers):
            o, m = f"{side}_layers.{i}", f"{side}_l{i + 1}"
            linear(f"{o}.self_attn.qkv_proj", f"{m}_self", "qkv")
            linear(f"{o}.self_attn.out_proj", f"{m}_self", "o")
            norm(f"{o}.sublayers.0.norm", f"{m}_self_Wo")
            linear(f"{o}.ffn.w1", f"{m}_ffn", "1")
            linear(f"{o}.ffn.w2", f"{m}_ffn", "2")
            norm(f"{o}.sublayers.{2 if side == 'decoder' else 1}.norm", f"{m}_ffn_ffn")
            if side == "decoder":
                linear(f"{o}.cross_attn.q_proj", f"{m}_context", "q")
                linear(f"{o}.cross_attn.kv_proj", f"{m}_context", "kv")
                linear(f"{o}.cross_attn.out_proj", f"{m}_context", "o")
                norm(f"{o}.sublayers.1.norm", f"{m}_context_Wo")
        if c.norm == "pre":
            plan[f"{side}_norm.weight"] = ([f"{side}_top_ln_scale"], False)
            plan[f"{side}_norm.bias"] = ([f"{side}_top_ln_bias"], False)
    return plan


def convert_weights(r: Release, c: ModelConfig) -> dict[str, torch.Tensor]:
    """Our stored tensors (float32) before the zero-start row is appended, every name and shape
    asserted and every Marian tensor used."""
    w = {n: torch.from_numpy(np.asarray(a, dtype=np.float32)) for n, a in r.weights.items()}
    used: set[str] = set()
    out: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    for ours, (names, transposed) in weight_plan(c).items():
        missing = [n for n in names if n not in w]
        if missing:
            problems.append(f"no {', '.join(missing)} (for {ours})")
            continue
        parts = [w[n].t() if transposed else w[n].reshape(-1) for n in names]  # [in, out] -> [out, in]; [1, d] -> [d]
        out[ours] = torch.cat(parts) if len(parts) > 1 else parts[0]
        used.update(names)

    source = w.get("Wemb", w.get("encoder_Wemb"))
    target = w.get("Wemb", w.get("decoder_Wemb"))
    used.update(n for n in ("Wemb", "encoder_Wemb", "decoder_Wemb") if n in w)
    out["src_embed.weight"], out["tgt_embed.weight"] = source, target
    if "decoder_ff_logit_out_W" in w:
        out["output_proj.weight"] = w["decoder_ff_logit_out_W"].t()
    else:
        out["output_proj.weight"] = w.get("decoder_ff_logit_out_Wt", target)
    out["output_proj.bias"] = w.get("decoder_ff_logit_out_b", torch.zeros(1, c.tgt_vocab_size - 1)).reshape(-1)
    used.update(n for n in ("decoder_ff_logit_out_W", "decoder_ff_logit_out_Wt", "decoder_ff_logit_out_b") if n in w)

    table = marian_positions(c.max_positions, c.d_model)
    if "Wpos" in w:  # trained positions (--transformer-train-position-embeddings)
        used.add("Wpos")
        table = w["Wpos"][: c.max_positions]  # (positions, d)
    out["positions"] = table

    # the shapes before the zero-start row: one row fewer in each vocabulary matrix
    before = dataclasses.replace(c, tgt_vocab_size=c.tgt_vocab_size - 1,
                                 src_vocab_size=c.src_vocab_size - (1 if c.share_embeddings else 0),
                                 pad_id=0, bos_id=0, decoder_start_id=0)
    expected = {n: t.shape for n, t in stored_state(Transformer(before)).items()}
    check_mapping(problems, out, expected, sorted(set(w) - used), "the model.yml")
    if problems:
        raise MarianNpzError(f"{r.npz}: " + "; ".join(problems[:12]))
    return out


def readme_languages(folder: Path) -> tuple[str | None, str | None]:
    """The source and target language of a release's README.md (`* source language(s): eng`), as
    ISO 639-1 codes where it names one language each; else None."""
    readme = folder / "README.md"
    if not readme.is_file():
        return None, None
    text = readme.read_text(encoding="utf-8", errors="replace")
    found = []
    for side in ("source", "target"):
        m = re.search(rf"^\*\s*{side} language\(s\):\s*(.+)$", text, re.MULTILINE)
        codes = m.group(1).split() if m else []
        found.append(ISO_639_3.get(codes[0], codes[0] if len(codes[0]) == 2 else None) if len(codes) == 1 else None)
    return found[0], found[1]


def import_marian_npz(folder: str | Path, out_dir: str | Path, source_lang: str | None = None,
                      target_lang: str | None = None, dtype: str = "float32") -> Path:
    """Convert the Marian release `folder` into a checkpoint directory `out_dir`. The languages
    default to the README's."""
    if dtype not in DTYPES:
        raise MarianNpzError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    r = read_release(folder)
    labels = sorted(p for p in r.source_vocab if re.fullmatch(r">>\w+<<", p))
    if labels:
        raise MarianNpzError(f"{r.folder}: a multilingual model (target-language tokens {', '.join(labels[:4])}"
                             f"{', ...' if len(labels) > 4 else ''} start each source); not supported")
    readme_source, readme_target = readme_languages(r.folder)
    source_lang, target_lang = source_lang or readme_source, target_lang or readme_target
    if not source_lang or not target_lang:
        raise MarianNpzError(f"{r.folder}: its README.md names no single source and target language; import it with "
                             "`nmt import-marian FOLDER OUT --source xx --target yy`")
    c = our_config(r)
    state = with_zero_start(convert_weights(r, c), c)
    model = Transformer(c)
    with torch.no_grad():
        for name, tensor in stored_state(model).items():
            tensor.copy_(state[name])
    source_vocab, target_vocab = dict(r.source_vocab), dict(r.target_vocab)
    target_vocab[ZERO_START] = c.tgt_vocab_size - 1
    if c.share_embeddings:
        source_vocab[ZERO_START] = c.src_vocab_size - 1
    metadata = {"source_lang": source_lang, "target_lang": target_lang,
                "imported_from": {"format": "marian-npz", "path": str(r.folder.resolve()), "npz": r.npz.name,
                                  "model_yml": {k: v for k, v in r.options.items() if isinstance(v, (str, int, float,
                                                                                                       bool))}}}
    save_checkpoint(Path(out_dir), model, r.source_spm, r.target_spm, metadata, source_vocab=source_vocab,
                    target_vocab=target_vocab, dtype=dtype)
    return Path(out_dir)
