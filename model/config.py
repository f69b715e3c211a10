"""A model's shape (`ModelConfig`, config.json) and what a checkpoint directory says about itself
without loading its weights (`read_header`): the server process reads these and never imports torch.

A checkpoint directory holds config.json, model.safetensors, source.spm/target.spm, optional
source_vocab.json/target_vocab.json, and metadata.json (languages, training summary).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, fields
from pathlib import Path

ACTIVATIONS = ("relu", "gelu", "swish")
MAX_BEAM = 16  # the widest beam a Translator decodes with
CHECKPOINT_FILES = ("config.json", "model.safetensors", "source.spm", "target.spm", "metadata.json")
SHORTLIST_FILE = "shortlist.safetensors"  # optional: the vocabulary shortlist of model/shortlist.py


class CheckpointError(ValueError):
    pass


@dataclass
class ModelConfig:
    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    norm: str = "post"  # "post": LayerNorm(x + Sublayer(x)) as in the paper; "pre": x + Sublayer(LayerNorm(x))
    activation: str = "relu"  # relu | gelu | swish
    share_embeddings: bool = False  # one matrix for source and target tokens (needs one vocabulary)
    tie_output: bool = True  # output projection = target embedding matrix (section 3.4)
    output_bias: bool = False
    scale_embedding: bool = True  # multiply embeddings by sqrt(d_model) (section 3.4)
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_positions: int = 1024
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3
    decoder_start_id: int = 1  # first decoder input; Marian models use pad_id here
    source_eos: bool = True  # EOS ends every source (OpenNMT-py's models, as Argos ships them, have none)
    position_table: bool = False  # positions stored with the weights (an imported model's own table), not computed

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.norm not in ("post", "pre"):
            raise ValueError(f"norm must be 'post' or 'pre', got {self.norm!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("share_embeddings needs src_vocab_size == tgt_vocab_size")

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> ModelConfig:
        data = json.loads(Path(path).read_text())
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown config fields {unknown}; known: {sorted(known)}")
        return cls(**data)


@dataclass
class CheckpointHeader:
    directory: Path
    config: ModelConfig
    metadata: dict
    tensors: dict[str, tuple[str, list[int]]]  # name -> (safetensors dtype, shape), from the file's header

    @property
    def parameters(self) -> int:
        """Parameters stored (tied tensors are stored once, so these are exactly the unique ones)."""
        total = 0
        for _, shape in self.tensors.values():
            count = 1
            for size in shape:
                count *= size
            total += count
        return total


def read_header(directory: str | Path) -> CheckpointHeader:
    """The config, metadata and tensor list of a checkpoint directory; CheckpointError says what
    is missing or malformed. Reads the safetensors header only, not the weights."""
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"{d}: not a checkpoint directory")
    missing = [f for f in CHECKPOINT_FILES if not (d / f).is_file()]
    if missing:
        raise CheckpointError(f"{d}: missing {', '.join(missing)}")
    try:
        config = ModelConfig.load(d / "config.json")
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{d / 'config.json'}: {e}") from e
    try:
        metadata = json.loads((d / "metadata.json").read_text())
    except ValueError as e:
        raise CheckpointError(f"{d / 'metadata.json'}: {e}") from e
    path = d / "model.safetensors"
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 * 2**20:
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(f.read(length))
        tensors = {name: (info["dtype"], list(info["shape"])) for name, info in header.items() if name != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise CheckpointError(f"{path}: unreadable ({e})") from e
    try:
        length_penalty_of(metadata)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{d / 'metadata.json'}: {e}") from e
    return CheckpointHeader(d, config, metadata, tensors)


# the range a length penalty may take, in a model's metadata and in a request
MAX_LENGTH_PENALTY = 10.0


def length_penalty_of(metadata: dict) -> float:
    """The length penalty a model decodes with unless a caller gives one: its metadata's
    `decoding.length_penalty` (`nmt tune-length-penalty` chooses it on the dev set), else 1.0."""
    decoding = metadata.get("decoding") or {}
    if not isinstance(decoding, dict):
        raise ValueError(f"'decoding' must be an object, got {decoding!r}")
    value = decoding.get("length_penalty", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_LENGTH_PENALTY:
        raise ValueError(f"decoding.length_penalty must be a number from 0 to {MAX_LENGTH_PENALTY:g}, got {value!r}")
    return float(value)
