"""Read a CTranslate2 model directory (what Argos Translate packages and LibreTranslate ship) as one
of our checkpoints.

    nmt import-ct2 path/to/ct2-model OUT_DIR --spm sentencepiece.model

A directory holds `model.bin`, `config.json` (binary version >= 6; older files keep their settings
inside model.bin) and `shared_vocabulary.json`, or `source_vocabulary.json` and
`target_vocabulary.json` (`.txt`, a token a line, before CTranslate2 2.0). `model.bin` is, little
endian (CTranslate2's python/ctranslate2/specs/model_spec.py and src/models/model.cc):

    u32 version; version >= 2: str spec name, u32 spec revision
    u32 count, then per variable: str name, u8 rank, u32 dims[rank],
        version >= 4: u8 dtype (0 f32, 1 i8, 2 i16, 3 i32, 4 f16, 5 bf16), u32 bytes
        version <  4: u8 item size, u32 elements
        the raw C-order data
    version >= 3: u32 count, then (str alias, str target) each
    str: u16 length with the NUL, UTF-8, NUL

int8 weights come with `<name>_scale` (float32, one per output row): W = Wq / scale[:, None];
int16 with one scalar scale. They are dequantized here, as CTranslate2 does for compute_type
float32, and the checkpoint stores float32 (or what --dtype asks).

Every TransformerSpec variable maps onto one of ours with its shape asserted, or the import is
refused with a message naming the feature and the file: relative positions, rotary, ALiBi,
multi-query attention, a LayerNorm on the embeddings, merged embeddings, an activation we do not
have. A stored position table other than our sinusoids (OpenNMT-py's interleave sines and
cosines; learned ones) is kept in the checkpoint (`position_table`), and a model whose sources
carry no </s> (`add_source_eos` false, as OpenNMT-py trains) gets none (`source_eos`).

Flags and scalars follow CTranslate2's C++ reading of them (src/layers/transformer.cc and
common.cc), per side: `{encoder,decoder}/scale_embeddings` (or the older
`.../embeddings/multiply_by_sqrt_depth`) is a flag when stored as int8, 1 meaning "times
sqrt(d_model)" (the default of every Transformer spec, so of every Argos package), and the factor
itself when stored as a float; absent, it scales by sqrt(d_model) (`embedding_scale`).
`pre_norm` defaults to true and `activation` to ReLU; the encoder's and the decoder's must agree
(our model has one of each) or the import is refused by name. `layer_norm_epsilon` in config.json
must be 1e-5 (CTranslate2's default for a LayerNorm with a bias, ours).

Marian's zero vector as the first decoder input (`start_from_zero_embedding`, what CTranslate2's
converters write for OPUS-MT models) becomes a token of our own: a target vocabulary row appended
with a zero embedding and a -1e9 output bias, which decoding starts from and never writes (it is
also the padding id).
"""

from __future__ import annotations

import argparse
import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from model.checkpoint import DTYPES, save_checkpoint, stored_state
from model.config import ModelConfig
from model.transformer import Transformer, sinusoidal_positions

DTYPE_IDS = {0: torch.float32, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.float16, 5: torch.bfloat16}
ITEM_SIZES = {4: torch.float32, 2: torch.int16, 1: torch.int8}  # binary versions 1-3
ACTIVATIONS = {0: "relu", 3: "gelu", 2: "swish"}  # CTranslate2's ids; 1 (GELU tanh), 4-6 are not ours
ACTIVATION_NAMES = {1: "GELU with the tanh approximation", 4: "GELU with the sigmoid approximation",
                    5: "Tanh", 6: "Sigmoid"}


class CT2ImportError(ValueError):
    pass


@dataclass
class CT2Model:
    path: Path
    version: int
    spec: str
    revision: int
    variables: dict[str, torch.Tensor]  # aliases resolved to the tensors they name
    config: dict = field(default_factory=dict)  # config.json, or {} for files before it
    source_vocabulary: list[str] = field(default_factory=list)
    target_vocabulary: list[str] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # a variable stored once under another name

    def scalar(self, *names: str, default=None):
        """The first of these scalar variables the model has (revision < 5 keeps them at the top level)."""
        for name in names:
            if name in self.variables:
                return self.variables[name].item()
        return default


# --- model.bin ---------------------------------------------------------------------------------

class _Reader:
    def __init__(self, data: bytes, path: Path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, size: int) -> bytes:
        if self.pos + size > len(self.data):
            raise CT2ImportError(f"{self.path}: truncated (needs {size} bytes at offset {self.pos})")
        chunk = self.data[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def string(self) -> str:
        raw = self.take(self.u16())
        return raw[:-1].decode("utf-8") if raw.endswith(b"\0") else raw.decode("utf-8")


def read_model_bin(path: str | Path) -> tuple[int, str, int, dict[str, torch.Tensor], dict[str, str]]:
    """(binary version, spec name, spec revision, variables with aliases resolved, the aliases)."""
    path = Path(path)
    r = _Reader(path.read_bytes(), path)
    version = r.u32()
    if not 1 <= version <= 6:
        raise CT2ImportError(f"{path}: binary version {version}; this reader knows versions 1 to 6")
    spec, revision = (r.string(), r.u32()) if version >= 2 else ("TransformerBase", 1)
    variables: dict[str, torch.Tensor] = {}
    for _ in range(r.u32()):
        name = r.string()
        shape = [r.u32() for _ in range(r.u8())]
        if version >= 4:
            type_id, size = r.u8(), r.u32()
            if type_id not in DTYPE_IDS:
                raise CT2ImportError(f"{path}: variable {name} has an unknown data type id {type_id}")
            dtype = DTYPE_IDS[type_id]
        else:
            item, count = r.u8(), r.u32()
            if item not in ITEM_SIZES:
                raise CT2ImportError(f"{path}: variable {name} has items of {item} bytes")
            dtype, size = ITEM_SIZES[item], item * count
        raw = bytearray(r.take(size))
        tensor = torch.frombuffer(raw, dtype=dtype) if size else torch.empty(0, dtype=dtype)
        count = 1
        for dim in shape:
            count *= dim
        if tensor.numel() != count:
            raise CT2ImportError(f"{path}: variable {name} holds {tensor.numel()} values for shape {shape}")
        variables[name] = tensor.reshape(shape)
    aliases = {}
    if version >= 3:
        for _ in range(r.u32()):
            alias, target = r.string(), r.string()
            if target not in variables:
                raise CT2ImportError(f"{path}: alias {alias} names {target}, which the file does not hold")
            variables[alias], aliases[alias] = variables[target], target
    return version, spec, revision, variables, aliases


def _vocabulary(directory: Path, stem: str) -> list[str] | None:
    if (directory / f"{stem}.json").is_file():
        tokens = json.loads((directory / f"{stem}.json").read_text(encoding="utf-8"))
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise CT2ImportError(f"{directory / f'{stem}.json'}: expected a JSON list of tokens")
        return tokens
    if (directory / f"{stem}.txt").is_file():
        return (directory / f"{stem}.txt").read_text(encoding="utf-8").split("\n")[:-1]
    return None


def read_directory(directory: str | Path) -> CT2Model:
    d = Path(directory)
    if not (d / "model.bin").is_file():
        raise CT2ImportError(f"{d}: no model.bin (not a CTranslate2 model directory)")
    version, spec, revision, variables, aliases = read_model_bin(d / "model.bin")
    config = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    shared = _vocabulary(d, "shared_vocabulary")
    source = shared or _vocabulary(d, "source_vocabulary")
    target = shared or _vocabulary(d, "target_vocabulary")
    if source is None or target is None:
        raise CT2ImportError(f"{d}: no shared_vocabulary.json, nor source_ and target_vocabulary (.json or .txt)")
    return CT2Model(d, version, spec, revision, variables, config, source, target, aliases)


# --- onto our model ----------------------------------------------------------------------------

def dequantized(model: CT2Model, name: str) -> torch.Tensor:
    """A weight in float32: int8 divided by its per-row scale, int16 by its scalar scale (an
    alias's scale is its target's)."""
    w = model.variables[name]
    if w.dtype in (torch.int8, torch.int16):
        scale = model.variables.get(f"{name}_scale", model.variables.get(f"{model.aliases.get(name)}_scale"))
        if scale is None:
            raise CT2ImportError(f"{model.path}: {name} is {w.dtype} without {name}_scale")
        scale = scale.float()
        return w.float() / (scale[:, None] if scale.dim() == 1 else scale)
    return w.float()


def refusals(model: CT2Model) -> list[str]:
    """What the file asks for that our model does not compute."""
    problems = []
    if model.spec not in ("TransformerSpec", "TransformerBase", "TransformerBig"):
        problems.append(f"model type {model.spec} (only TransformerSpec encoder-decoders)")
    names = set(model.variables)
    for marker, feature in (("relative_position_keys", "relative positions"),
                            ("relative_attention_bias", "relative attention bias"),
                            ("rotary", "rotary position embeddings"), ("alibi", "ALiBi"),
                            ("layernorm_embedding", "a LayerNorm on the embeddings")):
        if any(marker in n and model.variables[n].numel() > 1 for n in names) or \
                model.scalar(f"encoder/{marker}", f"decoder/{marker}", marker, default=0):
            problems.append(feature)
    if model.config.get("multi_query_attention") or model.scalar("multi_query_attention", default=0):
        problems.append("multi-query attention")
    if model.scalar("encoder/embeddings_merge", "embeddings_merge", default=0):
        problems.append("merged source features")
    if any(n.startswith("encoder/embeddings_1") for n in names):
        problems.append("source features (several source embeddings)")
    activation = model.scalar("encoder/activation", "activation", default=0)
    if activation not in ACTIVATIONS:
        problems.append(f"the activation {ACTIVATION_NAMES.get(activation, activation)}")
    if model.config.get("add_source_bos"):
        problems.append("a BOS token added to the source")
    return problems


def our_config(model: CT2Model, max_positions: int = 1024) -> ModelConfig:
    v = model.variables
    problems = refusals(model)
    encoder_layers = len({m.group(1) for n in v if (m := re.match(r"encoder/layer_(\d+)/", n))})
    decoder_layers = len({m.group(1) for n in v if (m := re.match(r"decoder/layer_(\d+)/", n))})
    src_embed = "encoder/embeddings_0/weight" if "encoder/embeddings_0/weight" in v else "encoder/embeddings/weight"
    if src_embed not in v or "decoder/embeddings/weight" not in v:
        problems.append("no encoder or decoder embedding")
    if problems:
        raise CT2ImportError(f"{model.path}: not supported: " + "; ".join(problems))
    d_model = v[src_embed].shape[1]
    heads = model.scalar("encoder/num_heads", "num_heads", default=16 if model.spec == "TransformerBig" else 8)
    pre_norm = _same_on_both_sides(model, "pre_norm", lambda side: bool(model.scalar(f"{side}/pre_norm", "pre_norm",
                                                                                     default=1)))
    activation = _same_on_both_sides(model, "activation", lambda side: model.scalar(f"{side}/activation",
                                                                                    "activation", default=0))
    epsilon = model.config.get("layer_norm_epsilon")
    if epsilon not in (None, 1e-5):
        raise CT2ImportError(f"{model.path / 'config.json'}: layer_norm_epsilon {epsilon}; our model uses 1e-5")
    scale = _same_on_both_sides(model, "embedding scale", lambda side: embedding_scale(model, side, d_model))
    if not (scale == 1.0 or abs(scale - d_model ** 0.5) < 1e-4):
        raise CT2ImportError(f"{model.path}: embeddings scaled by {scale}; our model scales by 1 or sqrt(d_model)")
    tokens = {k: model.config.get(f"{k}_token", d) for k, d in (("unk", "<unk>"), ("bos", "<s>"), ("eos", "</s>"))}
    start = model.config.get("decoder_start_token", tokens["bos"])
    target = {t: i for i, t in enumerate(model.target_vocabulary)}
    source = {t: i for i, t in enumerate(model.source_vocabulary)}
    pad = next((p for p in ("<blank>", "<pad>") if p in target), None)
    if zero_start(model):  # the appended row (convert_weights) starts decoding and pads
        start = pad = ZERO_START
        target[pad] = source[pad] = len(model.target_vocabulary)
    missing = [t for t in (tokens["unk"], tokens["eos"], start) if t not in target]
    if missing or pad is None:
        raise CT2ImportError(f"{model.path}: the target vocabulary lacks {', '.join(missing or ['a padding token'])}")
    if source.get(tokens["unk"]) != target[tokens["unk"]] or source.get(pad) != target[pad] \
            or source.get(tokens["eos"]) != target[tokens["eos"]]:
        raise CT2ImportError(f"{model.path}: <unk>, padding and </s> have other ids in the source vocabulary")
    share = model.source_vocabulary == model.target_vocabulary and \
        torch.equal(v[src_embed], v["decoder/embeddings/weight"])
    extra = 1 if zero_start(model) else 0
    table = v.get("encoder/position_encodings/encodings")
    if table is not None and not torch.equal(table, v.get("decoder/position_encodings/encodings", table)):
        raise CT2ImportError(f"{model.path}: the encoder and the decoder have different position tables")
    max_positions = table.shape[0] if table is not None else max_positions
    return ModelConfig(
        src_vocab_size=len(model.source_vocabulary) + (extra if share else 0),
        tgt_vocab_size=len(model.target_vocabulary) + extra, d_model=d_model,
        n_heads=int(heads), d_ff=v["encoder/layer_0/ffn/linear_0/weight"].shape[0], encoder_layers=encoder_layers,
        decoder_layers=decoder_layers, norm="pre" if pre_norm else "post",
        activation=ACTIVATIONS[activation],
        share_embeddings=share, tie_output=False, output_bias="decoder/projection/bias" in v or bool(extra),
        scale_embedding=scale != 1.0,
        dropout=0.0, max_positions=max_positions, pad_id=target[pad], bos_id=target.get(tokens["bos"], target[start]),
        eos_id=target[tokens["eos"]], unk_id=target[tokens["unk"]], decoder_start_id=target[start],
        # Marian appends </s> to every source whatever the file says (its tokenizer does); others as configured
        source_eos=zero_start(model) or bool(model.config.get("add_source_eos", False)),
        position_table=table is not None and not is_sinusoidal(table, d_model))


def embedding_scale(model: CT2Model, side: str, d_model: int) -> float:
    """What CTranslate2 multiplies `side`'s ("encoder" or "decoder") embeddings by, by its own rule
    (src/layers/transformer.cc, build_embeddings_scale): the variable `{side}/scale_embeddings`,
    or before it `{side}/embeddings/multiply_by_sqrt_depth`, is a flag when stored as int8 (a spec's
    `True`, the default of every Transformer spec: sqrt(d_model); 0: none) and the factor itself
    when stored as a float; a model without either is scaled by sqrt(d_model)."""
    for name in (f"{side}/scale_embeddings", f"{side}/embeddings/multiply_by_sqrt_depth"):
        if name in model.variables:
            stored = model.variables[name]
            if stored.dtype == torch.int8:
                return d_model ** 0.5 if stored.item() else 1.0
            return float(stored.item())
    return d_model ** 0.5


def _same_on_both_sides(model: CT2Model, what: str, read):
    """read("encoder"), which must equal read("decoder"): our model has one setting for both."""
    encoder, decoder = read("encoder"), read("decoder")
    if encoder != decoder:
        raise CT2ImportError(f"{model.path}: not supported: the encoder's {what} ({encoder}) differs from the "
                             f"decoder's ({decoder}); our model has one for both")
    return encoder


ZERO_START = "<zero-start>"  # the target token standing for Marian's zero start vector


def zero_start(model: CT2Model) -> bool:
    return bool(model.scalar("decoder/start_from_zero_embedding", "start_from_zero_embedding", default=0))


def is_sinusoidal(table: torch.Tensor, d_model: int) -> bool:
    """Whether a stored position table is our sinusoids (a half-precision copy of them included)."""
    tolerance = 1e-4 if table.dtype == torch.float32 else 1e-2
    return table.shape[1] == d_model and torch.allclose(table.float(), sinusoidal_positions(table.shape[0], d_model),
                                                        atol=tolerance)


def weight_plan(c: ModelConfig) -> dict[str, str]:
    """Our tensor name -> CTranslate2's variable name (biases and norms: the same with their suffix)."""
    plan: dict[str, str] = {}

    def linear(ours: str, theirs: str):
        plan[f"{ours}.weight"], plan[f"{ours}.bias"] = f"{theirs}/weight", f"{theirs}/bias"

    def norm(ours: str, theirs: str):
        plan[f"{ours}.weight"], plan[f"{ours}.bias"] = f"{theirs}/gamma", f"{theirs}/beta"

    for side, layers in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
        for i in range(layers):
            o, t = f"{side}_layers.{i}", f"{side}/layer_{i}"
            linear(f"{o}.self_attn.qkv_proj", f"{t}/self_attention/linear_0")
            linear(f"{o}.self_attn.out_proj", f"{t}/self_attention/linear_1")
            norm(f"{o}.sublayers.0.norm", f"{t}/self_attention/layer_norm")
            linear(f"{o}.ffn.w1", f"{t}/ffn/linear_0")
            linear(f"{o}.ffn.w2", f"{t}/ffn/linear_1")
            norm(f"{o}.sublayers.{2 if side == 'decoder' else 1}.norm", f"{t}/ffn/layer_norm")
            if side == "decoder":
                linear(f"{o}.cross_attn.q_proj", f"{t}/attention/linear_0")
                linear(f"{o}.cross_attn.kv_proj", f"{t}/attention/linear_1")
                linear(f"{o}.cross_attn.out_proj", f"{t}/attention/linear_2")
                norm(f"{o}.sublayers.1.norm", f"{t}/attention/layer_norm")
        if c.norm == "pre":
            norm(f"{side}_norm", f"{side}/layer_norm")
    linear("output_proj", "decoder/projection")
    plan["src_embed.weight"] = "encoder/embeddings_0/weight"
    plan["tgt_embed.weight"] = "decoder/embeddings/weight"
    return plan


def convert_weights(model: CT2Model, c: ModelConfig) -> dict[str, torch.Tensor]:
    """Our stored tensors (float32), every name and shape asserted; a missing bias is zeros (what
    a layer without one computes)."""
    v = dict(model.variables)
    if "encoder/embeddings_0/weight" not in v:
        v["encoder/embeddings_0/weight"] = v["encoder/embeddings/weight"]
    model = CT2Model(model.path, model.version, model.spec, model.revision, v, model.config, aliases=model.aliases)
    if zero_start(model):  # the appended row comes after (with_zero_start)
        import dataclasses

        c = dataclasses.replace(c, tgt_vocab_size=c.tgt_vocab_size - 1,
                                src_vocab_size=c.src_vocab_size - (1 if c.share_embeddings else 0),
                                output_bias="decoder/projection/bias" in v, pad_id=0, bos_id=0, eos_id=0, unk_id=0,
                                decoder_start_id=0)  # ids do not change shapes
    expected = {n: t.shape for n, t in stored_state(Transformer(c)).items()}
    out, problems = {}, []
    for ours, theirs in weight_plan(c).items():
        if ours not in expected:
            continue
        if theirs in v:
            out[ours] = dequantized(model, theirs)
        elif theirs.endswith("/bias"):
            out[ours] = torch.zeros(expected[ours])
        else:
            problems.append(f"no {theirs} (for {ours})")
            continue
        if tuple(out[ours].shape) != tuple(expected[ours]):
            problems.append(f"{theirs}: shape {tuple(out[ours].shape)}, expected {tuple(expected[ours])}")
    if c.position_table:
        out["positions"] = v["encoder/position_encodings/encodings"].float()
    problems += [f"nothing in the file for our {name}" for name in expected if name not in out]
    if problems:
        raise CT2ImportError(f"{model.path / 'model.bin'}: " + "; ".join(problems[:12]))
    return out


def with_zero_start(state: dict[str, torch.Tensor], c: ModelConfig) -> dict[str, torch.Tensor]:
    """The tensors with the zero-start row appended: a zero embedding, a zero output row whose
    bias is -1e9 (never written)."""
    out = dict(state)
    for name in ("tgt_embed.weight", "output_proj.weight") + (("src_embed.weight",) if c.share_embeddings else ()):
        if name in out:
            out[name] = torch.cat([out[name], out[name].new_zeros(1, out[name].shape[1])])
    bias = out.get("output_proj.bias", torch.zeros(c.tgt_vocab_size - 1))
    out["output_proj.bias"] = torch.cat([bias, bias.new_full((1,), -1e9)])
    return out


def import_ct2(ct2_dir: str | Path, out_dir: str | Path, source_spm: str | Path, target_spm: str | Path | None = None,
               source_lang: str | None = None, target_lang: str | None = None, dtype: str = "float32") -> Path:
    """Convert the CTranslate2 model directory `ct2_dir` (its SentencePiece model(s) given) into a
    checkpoint directory `out_dir`."""
    if dtype not in DTYPES:
        raise CT2ImportError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    model = read_directory(ct2_dir)
    config = our_config(model)
    state = convert_weights(model, config)
    if zero_start(model):
        state = with_zero_start(state, config)
    ours = Transformer(config)
    with torch.no_grad():
        for name, tensor in stored_state(ours).items():
            tensor.copy_(state[name])
    metadata = {"source_lang": source_lang, "target_lang": target_lang,
                "imported_from": {"format": "ctranslate2", "path": str(Path(ct2_dir).resolve()),
                                  "binary_version": model.version, "spec": model.spec, "revision": model.revision,
                                  "zero_start": zero_start(model),
                                  "config": model.config,
                                  "quantization": sorted({str(t.dtype).replace("torch.", "")
                                                          for n, t in model.variables.items()
                                                          if n.endswith("/weight")})}}
    vocab = {t: i for i, t in enumerate(model.source_vocabulary)}
    target_vocab = {t: i for i, t in enumerate(model.target_vocabulary)}
    if zero_start(model):
        target_vocab[ZERO_START] = len(model.target_vocabulary)
        if config.share_embeddings:
            vocab[ZERO_START] = len(model.source_vocabulary)
    save_checkpoint(Path(out_dir), ours, Path(source_spm), Path(target_spm or source_spm), metadata,
                    source_vocab=vocab, target_vocab=target_vocab, dtype=dtype)
    return Path(out_dir)


def export_ct2(model: Transformer, source_tokens: list[str], target_tokens: list[str], out: str | Path,
               add_source_eos: bool | None = None, quantization: str | None = None) -> Path:
    """Write one of our models as a CTranslate2 TransformerSpec directory (fused QKV and KV
    layouts map 1:1): for benchmarks against CTranslate2, and for tests of the reader on files
    CTranslate2's own spec classes write. Needs the `ctranslate2` package."""
    from ctranslate2.specs import common_spec, transformer_spec

    c = model.config
    acts = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
            "swish": common_spec.Activation.SWISH}
    spec = transformer_spec.TransformerSpec.from_config(
        (c.encoder_layers, c.decoder_layers), c.n_heads, pre_norm=c.norm == "pre", activation=acts[c.activation])
    sd = {k: t.detach().float().numpy() for k, t in model.state_dict().items()}

    def linear(s, name):
        s.weight = sd[f"{name}.weight"]
        if f"{name}.bias" in sd:
            s.bias = sd[f"{name}.bias"]

    def norm(s, name):
        s.gamma, s.beta = sd[f"{name}.weight"], sd[f"{name}.bias"]

    for side, stack, embed in (("encoder", spec.encoder, "src_embed"), ("decoder", spec.decoder, "tgt_embed")):
        stack.scale_embeddings = model.embed_scale
        stack.position_encodings.encodings = model.positions.float().numpy()
        (stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings).weight = sd[f"{embed}.weight"]
        if c.norm == "pre":
            norm(stack.layer_norm, f"{side}_norm")
        for i, layer in enumerate(stack.layer):
            p = f"{side}_layers.{i}"
            linear(layer.self_attention.linear[0], f"{p}.self_attn.qkv_proj")
            linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
            norm(layer.self_attention.layer_norm, f"{p}.sublayers.0.norm")
            if side == "decoder":
                linear(layer.attention.linear[0], f"{p}.cross_attn.q_proj")
                linear(layer.attention.linear[1], f"{p}.cross_attn.kv_proj")
                linear(layer.attention.linear[2], f"{p}.cross_attn.out_proj")
                norm(layer.attention.layer_norm, f"{p}.sublayers.1.norm")
            linear(layer.ffn.linear_0, f"{p}.ffn.w1")
            linear(layer.ffn.linear_1, f"{p}.ffn.w2")
            norm(layer.ffn.layer_norm, f"{p}.sublayers.{2 if side == 'decoder' else 1}.norm")
    linear(spec.decoder.projection, "output_proj")
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    spec.config.bos_token = target_tokens[c.bos_id]
    spec.config.eos_token = target_tokens[c.eos_id]
    spec.config.unk_token = target_tokens[c.unk_id]
    spec.config.decoder_start_token = target_tokens[c.decoder_start_id]
    spec.config.add_source_eos = c.source_eos if add_source_eos is None else add_source_eos
    spec.validate()
    spec.optimize(quantization=quantization)  # "int8": as Argos packages ship
    Path(out).mkdir(parents=True, exist_ok=True)
    spec.save(str(out))
    return Path(out)


def _command(args: argparse.Namespace) -> None:
    out = import_ct2(args.ct2_dir, args.out_dir, args.spm, args.target_spm, args.source_lang, args.target_lang,
                     args.dtype)
    c = ModelConfig.load(out / "config.json")
    print(f"imported {args.ct2_dir} -> {out}: d_model {c.d_model}, {c.n_heads} heads, ffn {c.d_ff}, "
          f"{c.encoder_layers}+{c.decoder_layers} layers, {c.norm}-norm, {c.activation}, "
          f"vocab {c.src_vocab_size}/{c.tgt_vocab_size}")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("import-ct2", help="convert a CTranslate2 model directory into a checkpoint",
                              description="Convert a CTranslate2 model directory (model.bin, config.json, "
                              "vocabularies) into this project's checkpoint format, dequantizing int8/int16.")
    p.add_argument("ct2_dir", metavar="CT2_DIR")
    p.add_argument("out_dir", metavar="OUT_DIR")
    p.add_argument("--spm", required=True, help="the source SentencePiece model (also the target's unless "
                   "--target-spm)")
    p.add_argument("--target-spm", help="the target SentencePiece model, when it is another")
    p.add_argument("--source-lang")
    p.add_argument("--target-lang")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.set_defaults(func=_command)
    return p
