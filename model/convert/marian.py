"""Import a Hugging Face MarianMT directory (OPUS-MT and the like) as one of our checkpoints.

    nmt import-marian path/to/opus-mt-en-de checkpoints/en-de

What HF's MarianMTModel computes, and how it maps onto `model.transformer.Transformer`:

* embeddings: token embedding * sqrt(d_model) (when `scale_embedding`) + a fixed sinusoidal
  table with sines in the first half and cosines in the second, position 0 for the first
  token on both sides (no offset) -- our `sinusoidal_positions` exactly;
* post-norm layers (LayerNorm(x + sublayer(x)), eps 1e-5), no LayerNorm after the
  embeddings and none at the end of either stack -- our `norm="post"`;
* attention scaled by head_dim ** -0.5 after separate q/k/v projections -- our fused
  `qkv_proj` (q, k, v stacked in that order) and `q_proj` + `kv_proj` (k, v);
* logits = decoder output @ embedding^T (tied, unless `tie_word_embeddings` is false)
  + `final_logits_bias` -- our `output_proj` with `output_bias=True`;
* decoding starts from `decoder_start_token_id`, which is PAD in Marian models; the
  generation config forbids PAD (`bad_words_ids`), which our search always does.

Anything in a config or in the weights that would make HF compute something else (or that
HF silently ignores although the config claims it) is refused, never guessed. Weights are
read with safetensors only; a `pytorch_model.bin` is refused because loading it would mean
unpickling.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from model.checkpoint import DTYPES, save_checkpoint, stored_state
from model.config import ModelConfig, length_penalty_of
from model.convert import check_mapping
from model.transformer import Transformer, sinusoidal_positions

# HF MarianConfig defaults (transformers 5.x) for keys a config.json may leave out.
HF_DEFAULTS = {
    "vocab_size": 58101, "decoder_vocab_size": None, "max_position_embeddings": 1024,
    "encoder_layers": 12, "encoder_ffn_dim": 4096, "encoder_attention_heads": 16,
    "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
    "activation_function": "gelu", "d_model": 1024, "dropout": 0.1, "attention_dropout": 0.0,
    "activation_dropout": 0.0, "decoder_start_token_id": 58100, "scale_embedding": False,
    "pad_token_id": 58100, "eos_token_id": 0, "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
}

# HF's ACT2FN names -> ours. "gelu" in HF is the exact (erf) GELU, as is F.gelu.
ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}

# Keys left over from the BART-derived Marian port. Current HF Marian ignores them and always
# computes the plain post-norm model, so a config that sets any of them away from this value
# describes a network that HF does not run; we refuse instead of picking one of the two.
MUST_BE = {
    "normalize_before": False,  # pre-norm layers
    "add_final_layer_norm": False,  # LayerNorm at the end of each stack
    "normalize_embedding": False,  # LayerNorm after the embeddings
    "layernorm_embedding": False,
    "static_position_embeddings": True,  # learned positions otherwise
    "add_bias_logits": False,
    "is_decoder": False,
    "is_encoder_decoder": True,
}


class MarianImportError(ValueError):
    pass


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise MarianImportError(f"{path}: not valid JSON ({e})") from e


def marian_model_config(hf: dict) -> ModelConfig:
    """HF MarianConfig (as the dict in config.json) -> our ModelConfig, or a clear refusal."""
    problems = []
    if hf.get("model_type") != "marian":
        problems.append(f"model_type is {hf.get('model_type')!r}, not 'marian'")
    archs = hf.get("architectures") or ["MarianMTModel"]
    if "MarianMTModel" not in archs:
        problems.append(f"architectures {archs} does not include MarianMTModel (the model with the output layer)")
    for key, value in MUST_BE.items():
        if key in hf and hf[key] is not None and bool(hf[key]) != value:
            problems.append(f"{key}={hf[key]!r} is not supported (HF Marian computes the model as if {key}={value})")
    c = {k: hf.get(k, d) for k, d in HF_DEFAULTS.items()}
    if c["encoder_attention_heads"] != c["decoder_attention_heads"]:
        problems.append(f"encoder_attention_heads={c['encoder_attention_heads']} and decoder_attention_heads="
                        f"{c['decoder_attention_heads']} differ; our model has one head count")
    if c["encoder_ffn_dim"] != c["decoder_ffn_dim"]:
        problems.append(f"encoder_ffn_dim={c['encoder_ffn_dim']} and decoder_ffn_dim={c['decoder_ffn_dim']} differ; "
                        "our model has one FFN size")
    act = c["activation_function"]
    if act not in ACTIVATIONS:
        problems.append(f"activation_function={act!r} is not supported (supported: {sorted(ACTIVATIONS)})")
    if c["d_model"] % 2:
        problems.append(f"d_model={c['d_model']} is odd; the sinusoidal table needs an even width")
    for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
        if not isinstance(c[key], int) or isinstance(c[key], bool):
            problems.append(f"{key}={c[key]!r} is not supported (one integer id expected)")
    share = bool(c["share_encoder_decoder_embeddings"])
    src_vocab = c["vocab_size"]
    tgt_vocab = src_vocab if share else (c["decoder_vocab_size"] or src_vocab)
    if problems:
        raise MarianImportError("unsupported Marian config: " + "; ".join(problems))
    try:
        return ModelConfig(
            src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, d_model=c["d_model"],
            n_heads=c["encoder_attention_heads"], d_ff=c["encoder_ffn_dim"],
            encoder_layers=c["encoder_layers"], decoder_layers=c["decoder_layers"], norm="post",
            activation=ACTIVATIONS[act], share_embeddings=share, tie_output=bool(c["tie_word_embeddings"]),
            output_bias=True, scale_embedding=bool(c["scale_embedding"]), dropout=float(c["dropout"]),
            attention_dropout=float(c["attention_dropout"]), activation_dropout=float(c["activation_dropout"]),
            max_positions=c["max_position_embeddings"], pad_id=c["pad_token_id"],
            # Marian has no BOS; decoding starts from PAD. bos_id only names a special id for
            # detokenization, so it is set to the start id rather than to some real token.
            bos_id=c["decoder_start_token_id"], eos_id=c["eos_token_id"], unk_id=0,  # unk_id: set from vocab
            decoder_start_id=c["decoder_start_token_id"],
        )
    except ValueError as e:
        raise MarianImportError(f"unsupported Marian config: {e}") from e


def weight_plan(config: ModelConfig) -> dict[str, list[str]]:
    """Our tensor name -> the HF tensor names concatenated (dim 0) to make it, for every tensor we
    store. The vocabulary matrices are resolved separately (`resolve_embeddings`)."""
    plan: dict[str, list[str]] = {}

    def linear(ours: str, hf: list[str]):
        plan[f"{ours}.weight"] = [f"{h}.weight" for h in hf]
        plan[f"{ours}.bias"] = [f"{h}.bias" for h in hf]

    for i in range(config.encoder_layers):
        o, h = f"encoder_layers.{i}", f"model.encoder.layers.{i}"
        linear(f"{o}.self_attn.qkv_proj", [f"{h}.self_attn.{p}_proj" for p in "qkv"])
        linear(f"{o}.self_attn.out_proj", [f"{h}.self_attn.out_proj"])
        linear(f"{o}.ffn.w1", [f"{h}.fc1"])
        linear(f"{o}.ffn.w2", [f"{h}.fc2"])
        linear(f"{o}.sublayers.0.norm", [f"{h}.self_attn_layer_norm"])
        linear(f"{o}.sublayers.1.norm", [f"{h}.final_layer_norm"])
    for i in range(config.decoder_layers):
        o, h = f"decoder_layers.{i}", f"model.decoder.layers.{i}"
        linear(f"{o}.self_attn.qkv_proj", [f"{h}.self_attn.{p}_proj" for p in "qkv"])
        linear(f"{o}.self_attn.out_proj", [f"{h}.self_attn.out_proj"])
        linear(f"{o}.cross_attn.q_proj", [f"{h}.encoder_attn.q_proj"])
        linear(f"{o}.cross_attn.kv_proj", [f"{h}.encoder_attn.{p}_proj" for p in "kv"])
        linear(f"{o}.cross_attn.out_proj", [f"{h}.encoder_attn.out_proj"])
        linear(f"{o}.ffn.w1", [f"{h}.fc1"])
        linear(f"{o}.ffn.w2", [f"{h}.fc2"])
        linear(f"{o}.sublayers.0.norm", [f"{h}.self_attn_layer_norm"])
        linear(f"{o}.sublayers.1.norm", [f"{h}.encoder_attn_layer_norm"])
        linear(f"{o}.sublayers.2.norm", [f"{h}.final_layer_norm"])
    return plan


POSITIONS = ["model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]


def resolve_embeddings(hf: dict, weights: dict[str, torch.Tensor]) -> tuple[dict[str, str], list[str]]:
    """Which HF tensor each of the three vocabulary matrices comes from, as transformers 5.x
    computes: {"src": name, "tgt": name, "out": name}, plus problems found.

    HF ties `model.encoder/decoder.embed_tokens` to `model.shared` when
    `share_encoder_decoder_embeddings` and `tie_word_embeddings` hold, and `lm_head` to the
    decoder embedding when `tie_word_embeddings` holds; untied, each module uses its own tensor
    (falling back to `model.shared`, what older HF versions always used, when the file has no
    own tensor). Tied copies a file does carry must equal the tensor they are tied to.
    """
    share = bool(hf.get("share_encoder_decoder_embeddings", HF_DEFAULTS["share_encoder_decoder_embeddings"]))
    tie = bool(hf.get("tie_word_embeddings", HF_DEFAULTS["tie_word_embeddings"]))
    enc, dec, shared, head = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                              "model.shared.weight", "lm_head.weight")
    problems: list[str] = []

    def pick(*names: str) -> str | None:
        return next((n for n in names if n in weights), None)

    def same(a: str, b: str) -> bool:
        return weights[a].shape == weights[b].shape and torch.equal(weights[a], weights[b])

    if share and tie:
        src = tgt = pick(shared, enc, dec)
        copies = [enc, dec]
    else:
        src, tgt = pick(enc, shared), pick(dec, shared) if share else pick(dec)
        copies = []
    out = tgt if tie else pick(head)
    if tie:
        copies.append(head)
    if src is None or tgt is None or out is None:
        missing = [what for what, name in (("source embedding", src), ("target embedding", tgt),
                                          ("output projection (lm_head.weight)", out)) if name is None]
        return {}, [f"no tensor for the {', '.join(missing)}"]
    for copy in copies:
        if copy in weights and copy not in (src, tgt) and not same(copy, tgt):
            problems.append(f"{copy} differs from {tgt}, but config.json ties them")
    return {"src": src, "tgt": tgt, "out": out}, problems


def _load_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    single, index = hf_dir / "model.safetensors", hf_dir / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = [hf_dir / f for f in sorted(set(_read_json(index).get("weight_map", {}).values()))]
    else:
        pickles = [p.name for p in (hf_dir / "pytorch_model.bin", hf_dir / "tf_model.h5", hf_dir / "flax_model.msgpack")
                   if p.exists()]
        if pickles:
            raise MarianImportError(
                f"{hf_dir} has {', '.join(pickles)} but no model.safetensors. This project never loads pickled "
                "weights (unpickling can run arbitrary code). Convert the model to safetensors first, in an "
                "environment you trust, e.g. `python -c \"from transformers import MarianMTModel; "
                f"MarianMTModel.from_pretrained('{hf_dir}').save_pretrained('CONVERTED_DIR')\"` (and copy the "
                "tokenizer files), or download the model's model.safetensors if the hub has one.")
        raise MarianImportError(f"{hf_dir}: no model.safetensors")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise MarianImportError(f"{f}: unreadable ({e})") from e
    return weights


def convert_weights(config: ModelConfig, weights: dict[str, torch.Tensor], sources: dict[str, str],
                    problems: list[str]) -> dict[str, torch.Tensor]:
    """HF MarianMTModel tensors -> our stored tensors (float32), asserting every name and shape
    and that no HF tensor is left unused. `sources`: from `resolve_embeddings`."""
    expected = {n: t.shape for n, t in stored_state(Transformer(config)).items()}
    used: set[str] = set()
    out: dict[str, torch.Tensor] = {}
    problems = list(problems)

    for ours, parts in weight_plan(config).items():
        missing = [p for p in parts if p not in weights]
        if missing:
            problems.append(f"missing {', '.join(missing)} (for {ours})")
            continue
        out[ours] = torch.cat([weights[p].float() for p in parts], dim=0) if len(parts) > 1 else weights[parts[0]].float()
        used.update(parts)

    for ours, key in (("src_embed.weight", "src"), ("tgt_embed.weight", "tgt"), ("output_proj.weight", "out")):
        if ours in expected and key in sources:
            out[ours] = weights[sources[key]].float()
    used.update(sources.values())
    used.update(n for n in ("model.shared.weight", "model.encoder.embed_tokens.weight",
                            "model.decoder.embed_tokens.weight", "lm_head.weight") if n in weights)  # checked copies

    if "output_proj.bias" in expected:
        if "final_logits_bias" in weights:
            out["output_proj.bias"] = weights["final_logits_bias"].float().reshape(-1)
            used.add("final_logits_bias")
        else:  # HF initialises a missing final_logits_bias to zeros
            out["output_proj.bias"] = torch.zeros(config.tgt_vocab_size)

    table = sinusoidal_positions(config.max_positions, config.d_model)
    for name in POSITIONS:
        if name in weights:
            used.add(name)
            w = weights[name].float()
            if w.shape != table.shape or not torch.allclose(w, table, atol=1e-4):
                problems.append(f"{name} is not the sinusoidal table HF Marian computes (learned or shifted "
                                "positions are not supported)")

    check_mapping(problems, out, expected, sorted(set(weights) - used), "config.json")
    if problems:
        raise MarianImportError("HF weights do not match the Marian model config.json describes: "
                                + "; ".join(problems[:12]) + (f" (and {len(problems) - 12} more)" if len(problems) > 12 else ""))
    return out


def _check_vocab(vocab: dict, size: int, name: str, config: ModelConfig) -> None:
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise MarianImportError(f"{name}: expected a JSON object piece -> integer id")
    bad = [p for p, i in vocab.items() if not 0 <= i < size]
    if bad:
        raise MarianImportError(f"{name}: {len(bad)} ids outside the embedding's {size} rows (e.g. {bad[0]!r})")
    for piece, cid, key in (("</s>", config.eos_id, "eos_token_id"), ("<pad>", config.pad_id, "pad_token_id")):
        if piece in vocab and vocab[piece] != cid:
            raise MarianImportError(f"{name}: {piece} has id {vocab[piece]} but config.json {key} is {cid}")
    if "<unk>" not in vocab:
        raise MarianImportError(f"{name}: no <unk> entry")


def import_marian(hf_dir: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Convert the HF MarianMT directory `hf_dir` into a checkpoint directory `out_dir`."""
    hf, out = Path(hf_dir), Path(out_dir)
    if not hf.is_dir():
        raise MarianImportError(f"{hf}: not a directory")
    if dtype not in DTYPES:
        raise MarianImportError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    missing = [f for f in ("config.json", "source.spm", "target.spm", "vocab.json") if not (hf / f).is_file()]
    if missing:
        raise MarianImportError(f"{hf}: missing {', '.join(missing)}")
    hf_config = _read_json(hf / "config.json")
    tok_config = _read_json(hf / "tokenizer_config.json") if (hf / "tokenizer_config.json").is_file() else {}
    config = marian_model_config(hf_config)

    separate = bool(tok_config.get("separate_vocabs", (hf / "target_vocab.json").is_file()))
    source_vocab = _read_json(hf / "vocab.json")
    if separate:
        if not (hf / "target_vocab.json").is_file():
            raise MarianImportError(f"{hf}: tokenizer_config.json sets separate_vocabs but target_vocab.json is missing")
        target_vocab = _read_json(hf / "target_vocab.json")
    else:
        target_vocab = source_vocab
    _check_vocab(source_vocab, config.src_vocab_size, "vocab.json", config)
    _check_vocab(target_vocab, config.tgt_vocab_size, "target_vocab.json" if separate else "vocab.json", config)
    if source_vocab["<unk>"] != target_vocab["<unk>"]:
        raise MarianImportError(f"<unk> has id {source_vocab['<unk>']} in the source vocabulary and "
                                f"{target_vocab['<unk>']} in the target one; our models have one unk id")
    config.unk_id = source_vocab["<unk>"]

    weights = _load_weights(hf)
    sources, problems = resolve_embeddings(hf_config, weights)
    if sources:
        # share/tie exactly when the matrices HF computes with are one tensor (or equal ones)
        def same(a: str, b: str) -> bool:
            return a == b or (weights[a].shape == weights[b].shape and torch.equal(weights[a], weights[b]))

        share = config.src_vocab_size == config.tgt_vocab_size and same(sources["src"], sources["tgt"])
        config = dataclasses.replace(config, share_embeddings=share, tie_output=same(sources["out"], sources["tgt"]))
    state = convert_weights(config, weights, sources, problems)
    model = Transformer(config)
    expected = stored_state(model)
    with torch.no_grad():
        for name, tensor in expected.items():
            tensor.copy_(state[name])

    gen = _read_json(hf / "generation_config.json") if (hf / "generation_config.json").is_file() else {}
    codes = sorted(p for p in target_vocab if p.startswith(">>") and p.endswith("<<"))
    metadata = {
        "source_lang": tok_config.get("source_lang"),
        "target_lang": tok_config.get("target_lang"),
        "imported_from": {
            "format": "huggingface-marian", "path": str(hf.resolve()),
            "transformers_version": hf_config.get("transformers_version"),
            "separate_vocabs": separate,
            # for reference only: our search has no forced EOS at the length cap and always forbids PAD
            "generation_config": {k: gen[k] for k in ("num_beams", "max_length", "max_new_tokens", "length_penalty",
                                                     "bad_words_ids", "forced_eos_token_id") if k in gen},
        },
    }
    alpha = gen.get("length_penalty")
    with contextlib.suppress(ValueError):  # what `generate` ranks with by default, unless we cannot use it
        if alpha is not None:
            metadata["decoding"] = {"length_penalty": length_penalty_of({"decoding": {"length_penalty": alpha}})}
    if codes:
        metadata["imported_from"]["language_codes"] = codes[:1000]
    save_checkpoint(out, model, hf / "source.spm", hf / "target.spm", metadata,
                    source_vocab=source_vocab, target_vocab=target_vocab, dtype=dtype)
    return out


def _command(args: argparse.Namespace) -> None:
    from model.convert.marian_npz import import_marian_npz, is_release

    if is_release(Path(args.hf_dir)):
        out = import_marian_npz(args.hf_dir, args.out_dir, args.source, args.target, dtype=args.dtype)
    else:
        out = import_marian(args.hf_dir, args.out_dir, dtype=args.dtype)
    c = ModelConfig.load(out / "config.json")
    print(f"imported {args.hf_dir} -> {out}: d_model {c.d_model}, {c.n_heads} heads, ffn {c.d_ff}, "
          f"{c.encoder_layers}+{c.decoder_layers} layers, {c.activation}, vocab {c.src_vocab_size}/{c.tgt_vocab_size}"
          f"{' shared' if c.share_embeddings else ''}")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "import-marian", help="convert a Marian model (a Hugging Face MarianMT folder or an OPUS-MT .npz release "
                              "folder) into a checkpoint",
        description="Convert a Hugging Face MarianMT model directory (config.json, model.safetensors, source.spm, "
                    "target.spm, vocab.json [, target_vocab.json]) or a Marian release folder as OPUS-MT-train and "
                    "the Tatoeba-Challenge publish it (decoder.yml, the .npz, its .yml vocabularies, source.spm, "
                    "target.spm, README.md) into this project's checkpoint format.")
    p.add_argument("hf_dir", metavar="MODEL_DIR", help="the Hugging Face model directory or the release folder")
    p.add_argument("out_dir", metavar="OUT_DIR", help="checkpoint directory to write")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="dtype of the stored weights")
    p.add_argument("--source", help="a release folder's source language (default: its README.md's)")
    p.add_argument("--target", help="a release folder's target language (default: its README.md's)")
    p.set_defaults(func=_command)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m model.convert.marian")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
