"""A training run's state on disk: resumable snapshots (weights, optimizer, counters), the run's
checkpoints, averaging them, and growing a model into a larger one."""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from model.checkpoint import stored_state
from model.transformer import Transformer


@dataclass
class TrainState:
    step: int = 0  # optimizer updates done
    epoch: int = 0  # data position: epoch and next batch index within it
    position: int = 0
    src_tokens: int = 0
    tgt_tokens: int = 0
    elapsed: float = 0.0  # training wall seconds, summed over resumed sessions
    last_dev: dict = field(default_factory=dict)
    restored_at: int = -1  # step at which the run was restored from weights alone (-1: never)
    cooldown_start: int = -1  # step at which the cooldown began (-1: none)
    cooldown_steps: int = 0

    @property
    def cooldown_end(self) -> float:
        return self.cooldown_start + self.cooldown_steps if self.cooldown_start >= 0 else math.inf


def save_training_state(directory: Path, model: Transformer, optimizer: torch.optim.Adam, state: TrainState,
                        rng_state: torch.Tensor) -> Path:
    """Write checkpoints/step_N atomically: a temp folder renamed once complete."""
    final = directory / f"step_{state.step:07d}"
    tmp = directory / f".tmp_step_{state.step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {f"model.{n}": t.detach().contiguous() for n, t in stored_state(model).items()}
    params = list(model.parameters())
    for i, p in enumerate(params):
        for key, value in optimizer.state.get(p, {}).items():
            tensors[f"optim.{i}.{key}"] = torch.as_tensor(value).detach().clone().contiguous()
    tensors["rng.torch"] = rng_state
    save_file(tensors, str(tmp / "state.safetensors"))
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.state_dict()["param_groups"]]
    meta = {"train_state": asdict(state), "optimizer_param_groups": groups, "n_params": len(params)}
    (tmp / "state.json").write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def load_training_state(path: Path, model: Transformer, optimizer: torch.optim.Adam) -> tuple[TrainState, torch.Tensor]:
    """Restore weights and Adam state in place; returns the counters and the RNG state."""
    tensors = load_file(str(path / "state.safetensors"))
    meta = json.loads((path / "state.json").read_text())
    with torch.no_grad():
        for name, t in stored_state(model).items():
            t.copy_(tensors[f"model.{name}"])
    params = list(model.parameters())
    if meta["n_params"] != len(params):
        raise ValueError(f"{path}: {meta['n_params']} parameter tensors saved, model has {len(params)}")
    opt_state: dict[int, dict] = {}
    for key, t in tensors.items():
        if key.startswith("optim."):
            _, i, name = key.split(".", 2)
            opt_state.setdefault(int(i), {})[name] = t
    groups = [dict(g, params=list(range(len(params)))) for g in meta["optimizer_param_groups"]]
    for g in groups:
        g["betas"] = tuple(g["betas"])
    optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    return TrainState(**meta["train_state"]), tensors["rng.torch"]


def checkpoint_step(path: Path) -> int:
    """checkpoints/step_0001234 -> 1234."""
    return int(path.name.removeprefix("step_"))


def list_checkpoints(run_dir: Path) -> list[Path]:
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    return [c for c in ckpts if (c / "state.json").exists()]


def average_checkpoints(paths: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the model weights (section 6.1: the last 5 checkpoints)."""
    total: dict[str, torch.Tensor] = {}
    for p in paths:
        for k, t in load_file(str(p / "state.safetensors")).items():
            if k.startswith("model."):
                name = k[len("model."):]
                total[name] = total.get(name, 0) + t.double()
    return {k: (v / len(paths)).float() for k, v in total.items()}


def grow_weights(model: Transformer, weights: dict[str, torch.Tensor]) -> None:
    """Load weights of a model whose vocabulary is a prefix of this one's: embedding rows of the
    new pieces keep their fresh initialisation; every other tensor must match."""
    with torch.no_grad():
        for name, t in stored_state(model).items():
            w = weights[name]
            if w.shape != t.shape and (w.dim() != t.dim() or w.shape[1:] != t.shape[1:] or w.size(0) > t.size(0)):
                raise ValueError(f"{name}: {tuple(w.shape)} does not fit {tuple(t.shape)}")
            t[: w.size(0)].copy_(w)


def deepen_encoder(weights: dict[str, torch.Tensor], layers: int, new_layers: int) -> dict[str, torch.Tensor]:
    """Function-preserving depth growth, after Net2Net (Chen et al., 2016): encoder layer i of the
    checkpoint becomes layers i*k ... i*k+k-1 of the deeper model (k = new_layers / layers). The
    first keeps the trained weights; the others are copies whose output projections (attention
    out_proj, feed-forward w2) start at zero. With pre-norm residuals x + sublayer(norm(x)) such a
    copy is the identity, so the deeper model computes exactly what the checkpoint did, and
    training moves the copies away from it."""
    if new_layers % layers:
        raise ValueError(f"{new_layers} encoder layers is not a multiple of the checkpoint's {layers}")
    k, prefix = new_layers // layers, "encoder_layers."
    out = {}
    for name, t in weights.items():
        if not name.startswith(prefix):
            out[name] = t
            continue
        index, rest = name[len(prefix):].split(".", 1)  # "3", "self_attn.out_proj.weight"
        for copy in range(k):
            silent = copy > 0 and rest.split(".")[1] in ("out_proj", "w2")
            out[f"{prefix}{int(index) * k + copy}.{rest}"] = torch.zeros_like(t) if silent else t.clone()
    return out


def load_weights(model: Transformer, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, t in stored_state(model).items():
            t.copy_(weights[name])
