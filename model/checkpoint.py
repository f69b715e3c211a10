"""Saving and loading checkpoint directories (the format: model/config.py).

Weights are only ever read with safetensors; a pickle is never loaded. Loading checks every
tensor name and shape against the model the config describes and says what is wrong.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from model.config import CheckpointError, read_header
from model.tokenizer import Tokenizer
from model.transformer import Transformer, attention

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def stored_state(model: Transformer) -> dict[str, torch.Tensor]:
    """The state dict with tied tensors (shared embeddings, tied output) stored once."""
    seen, out = set(), {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[name] = tensor
    return out


def save_checkpoint(out_dir: Path, model: Transformer, source_spm: Path, target_spm: Path,
                    metadata: dict, source_vocab: dict | None = None, target_vocab: dict | None = None,
                    dtype: str = "float32") -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.config.save(out / "config.json")
    state = {n: t.detach().to("cpu", DTYPES[dtype]).contiguous() for n, t in stored_state(model).items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    for src, name in ((source_spm, "source.spm"), (target_spm, "target.spm")):
        if Path(src).resolve() != (out / name).resolve():
            shutil.copyfile(src, out / name)
    for vocab, name in ((source_vocab, "source_vocab.json"), (target_vocab, "target_vocab.json")):
        if vocab is not None:
            (out / name).write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "metadata.json").write_text(json.dumps(metadata, indent=2, ensure_ascii=False) + "\n")
    for f in out.iterdir():  # safetensors writes 0600; a service user other than the trainer must read it
        if f.is_file():
            f.chmod(0o644)


def load_checkpoint(directory: Path, device: str | torch.device = "cpu", dtype: str = "float32",
                    attention_fn=attention):
    """Returns (model in eval mode, tokenizer, metadata); attention_fn: see Transformer."""
    if dtype not in DTYPES:
        raise CheckpointError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    header = read_header(directory)
    d, config = header.directory, header.config
    model = Transformer(config, attention_fn)
    try:
        weights = load_file(str(d / "model.safetensors"))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{d / 'model.safetensors'}: unreadable ({e})") from e
    expected = stored_state(model)
    problems = [f"missing tensor {n}" for n in expected if n not in weights]
    problems += [f"unexpected tensor {n}" for n in weights if n not in expected]
    problems += [f"{n}: shape {tuple(weights[n].shape)} in file, {tuple(t.shape)} expected by config.json"
                 for n, t in expected.items() if n in weights and weights[n].shape != t.shape]
    if problems:
        raise CheckpointError(f"{d}: weights do not match config.json: " + "; ".join(problems[:10])
                              + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""))
    with torch.no_grad():
        for name, tensor in expected.items():
            tensor.copy_(weights[name])
    model = model.to(device=device, dtype=DTYPES[dtype]).eval()
    return model, Tokenizer.from_dir(d, config), header.metadata
