"""The served models as the server process sees them: languages, limits, tokenizer.

The server never loads weights (workers do); it reads each checkpoint's config, metadata and
SentencePiece models, so it can count tokens, reject over-long input and describe the model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from safetensors import safe_open

from model.checkpoint import CheckpointError
from model.tokenizer import Tokenizer
from model.transformer import ModelConfig

LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish", "de": "German",
    "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian", "fi": "Finnish", "fr": "French",
    "ga": "Irish", "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian", "it": "Italian",
    "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "nb": "Norwegian Bokmål",
    "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak",
    "sl": "Slovenian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


@dataclass
class ServedModel:
    id: str  # "<source>-<target>"
    source: str
    target: str
    directory: Path
    config: ModelConfig
    tokenizer: Tokenizer
    parameters: int

    @property
    def max_source_tokens(self) -> int:
        return self.config.max_positions

    def encode(self, text: str) -> list[int]:
        """Source ids, EOS included: exactly what the worker's Translator will decode."""
        return self.tokenizer.encode_source(text)

    def config_summary(self) -> dict:
        keys = ("d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers", "src_vocab_size",
                "tgt_vocab_size", "max_positions", "norm", "activation", "share_embeddings")
        config = asdict(self.config)
        return {k: config[k] for k in keys}


def load_model(directory: str | Path) -> ServedModel:
    d = Path(directory)
    for name in ("config.json", "metadata.json", "model.safetensors", "source.spm", "target.spm"):
        if not (d / name).is_file():
            raise CheckpointError(f"{d}: missing {name} (is NMT_MODEL_DIRS right?)")
    config = ModelConfig.load(d / "config.json")
    metadata = json.loads((d / "metadata.json").read_text())
    source, target = metadata.get("source_lang"), metadata.get("target_lang")
    if not source or not target:
        raise CheckpointError(f"{d / 'metadata.json'}: needs source_lang and target_lang")
    # tied tensors are stored once, so the file's tensors are exactly the unique parameters
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        parameters = 0
        for name in f.keys():
            count = 1
            for size in f.get_slice(name).get_shape():
                count *= size
            parameters += count
    return ServedModel(f"{source}-{target}", source, target, d, config, Tokenizer.from_dir(d, config), parameters)


class Registry:
    def __init__(self, models: list[ServedModel]):
        self.models: dict[str, ServedModel] = {}
        for m in models:
            if m.id in self.models:
                raise CheckpointError(f"two checkpoints serve {m.id}: {self.models[m.id].directory} and {m.directory}")
            self.models[m.id] = m

    @classmethod
    def load(cls, directories: list[str]) -> "Registry":
        if not directories:
            raise CheckpointError("no model directories given (NMT_MODEL_DIRS)")
        return cls([load_model(d) for d in directories])

    def sources(self) -> list[str]:
        return sorted({m.source for m in self.models.values()})

    def targets(self, source: str) -> list[str]:
        return sorted(m.target for m in self.models.values() if m.source == source)

    def pairs(self) -> str:
        return ", ".join(sorted(self.models))

    def resolve(self, source: str, target: str) -> tuple[ServedModel, bool]:
        """(the model for source -> target, whether source was 'auto'); ValueError says what is served.

        'auto' is not language detection: it resolves only when one source language is served.
        """
        auto = source == "auto"
        if auto:
            sources = self.sources()
            if len(sources) != 1:
                raise ValueError(f"source 'auto' needs exactly one served source language; "
                                 f"choose one of: {', '.join(sources)}")
            source = sources[0]
        model = self.models.get(f"{source}-{target}")
        if model is None:
            raise ValueError(f"no model translates {source!r} to {target!r}; served pairs: {self.pairs()}")
        return model, auto
