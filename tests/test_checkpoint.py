import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from model.checkpoint import load_checkpoint
from model.config import CheckpointError
from model.transformer import Transformer
from tests.conftest import make_tiny_checkpoint


def test_round_trip_keeps_every_weight(tmp_path):
    directory = make_tiny_checkpoint(tmp_path, seed=3, output_bias=True, norm="pre")
    model, tokenizer, metadata = load_checkpoint(directory)
    torch.manual_seed(3)
    original = Transformer(model.config)
    for name, tensor in original.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)
    assert metadata["source_lang"] == "en" and not model.training
    assert model.output_proj.weight is model.tgt_embed.weight  # ties survive loading
    assert tokenizer.encode_source("Open the file.")[-1] == model.config.eos_id


def test_fp16_storage_loads_as_requested_dtype(tmp_path):
    directory = make_tiny_checkpoint(tmp_path)
    model, *_ = load_checkpoint(directory, dtype="bfloat16")
    assert model.output_proj.weight.dtype == torch.bfloat16


def test_missing_files_are_named(tmp_path):
    directory = make_tiny_checkpoint(tmp_path)
    (directory / "target.spm").unlink()
    with pytest.raises(CheckpointError, match="missing target.spm"):
        load_checkpoint(directory)


def test_corrupted_weights_fail_clearly(tmp_path):
    directory = make_tiny_checkpoint(tmp_path)
    (directory / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(directory)


def test_mismatched_config_names_the_tensors(tmp_path):
    directory = make_tiny_checkpoint(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["d_ff"] = 48
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"encoder_layers.0.ffn.w1.weight: shape \(64, 64\) in file, \(48, 64\)"):
        load_checkpoint(directory)


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    directory = make_tiny_checkpoint(tmp_path)
    weights = load_file(str(directory / "model.safetensors"))
    weights["surprise"] = weights.pop("decoder_layers.1.ffn.w2.bias")
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing tensor decoder_layers.1.ffn.w2.bias; unexpected tensor surprise"):
        load_checkpoint(directory)


def test_unknown_config_field_is_rejected(tmp_path):
    directory = make_tiny_checkpoint(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["rotary"] = True
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unknown config fields"):
        load_checkpoint(directory)
