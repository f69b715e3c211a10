"""Settings from the environment, the worker layout they imply, and CORS (no model needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("NMT_MODEL_DIRS", "checkpoints/en-de, checkpoints/de-en")
    monkeypatch.setenv("NMT_API_KEYS", '["a", "b"]')
    monkeypatch.setenv("NMT_MAX_WAIT_MS", "12.5")
    monkeypatch.setenv("NMT_DEVICE", "cpu")
    s = Settings()
    assert s.model_dirs == ["checkpoints/en-de", "checkpoints/de-en"] and s.api_keys == ["a", "b"]
    assert s.max_wait_ms == 12.5 and s.cors_origins == [] and s.dtype == "auto"
    monkeypatch.setenv("NMT_DEVICE", "tpu")
    with pytest.raises(ValueError, match="device"):
        Settings()


def test_by_default_the_shipped_models_serve_both_directions(monkeypatch):
    monkeypatch.delenv("NMT_MODEL_DIRS", raising=False)
    root = Path(__file__).resolve().parents[1]
    metadata = [json.loads((root / d / "metadata.json").read_text()) for d in Settings().model_dirs]
    assert {(m["source_lang"], m["target_lang"]) for m in metadata} == {("en", "de"), ("de", "en")}


def test_http_processes_by_default_one_on_the_cpu_and_one_per_four_cores_on_a_gpu():
    assert Settings(device="auto").http_process_count(cuda_devices=0, cores=64) == 1
    assert Settings(device="cpu").http_process_count(cuda_devices=2, cores=64) == 1
    assert [Settings(device="auto").http_process_count(1, cores) for cores in (2, 4, 8, 12, 16, 96)] == [1, 1, 2, 3, 4, 4]
    assert Settings(device="cuda", http_processes=7).http_process_count(1, 2) == 7  # the operator's number stands
    assert Settings(device="cpu", http_processes=3).http_process_count(0, 2) == 3


def test_worker_layout(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert Settings(device="cpu").worker_layout(cuda_devices=2) == ("cpu", ["cpu"] * 4, 4)
    assert Settings(device="cpu", workers=3, threads_per_worker=2).worker_layout(0) == ("cpu", ["cpu"] * 3, 2)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert Settings(device="auto").worker_layout(0) == ("cpu", ["cpu", "cpu"], 1)
    assert Settings(device="auto").worker_layout(2) == ("cuda", ["cuda:0", "cuda:1"], 1)  # one worker per GPU
    assert Settings(device="auto", workers=3).worker_layout(2) == ("cuda", ["cuda:0", "cuda:1", "cuda:0"], 1)
    assert Settings(device="cuda", workers=2).worker_layout(1) == ("cuda", ["cuda:0", "cuda:0"], 1)
    with pytest.raises(ValueError, match="no CUDA device"):
        Settings(device="cuda").worker_layout(0)
    with pytest.raises(ValueError, match="CPU only"):
        Settings(dtype="int8").worker_layout(1)


def test_batch_budget_follows_the_device_unless_set():
    assert Settings().batch_token_budget("cpu") == 4096 and Settings().batch_token_budget("cuda") == 32768
    assert Settings(batch_tokens=1000).batch_token_budget("cuda") == 1000
    with pytest.raises(ValueError, match="at least 16"):
        Settings(batch_tokens=8)


def test_the_wait_for_company_follows_the_device_unless_set():
    assert Settings().batch_wait_s("cpu") == 0.0 and Settings().batch_wait_s("cuda") == 0.005
    assert Settings(max_wait_ms=3).batch_wait_s("cpu") == 0.003 == Settings(max_wait_ms=3).batch_wait_s("cuda")


def test_the_hold_after_a_batch_is_off_unless_set_and_only_batch_by_batch_with_one_worker(monkeypatch):
    from app.engine import Engine
    from app.metrics import Metrics

    monkeypatch.delenv("NMT_BATCH_HOLD_MS", raising=False)

    def hold_s(**settings) -> float:
        return Engine(Settings(device="cpu", **settings), {}, Metrics()).scheduler.hold_s

    assert hold_s(workers=1) == 0.0
    assert hold_s(workers=1, batch_hold_ms=7) == 0.007
    assert hold_s(workers=1, batch_hold_ms=7, running_batch="true") == 0.0
    assert hold_s(workers=2, batch_hold_ms=7) == 0.0


def test_a_long_requests_batches_are_short_on_the_cpu_unless_set():
    assert Settings().long_job_batch_items("cpu") == 8 and Settings().long_job_batch_items("cuda") == 0
    assert Settings(long_batch_items=0).long_job_batch_items("cpu") == 0
    assert Settings(long_batch_items=16).long_job_batch_items("cuda") == 16


def test_the_workers_niceness_defaults_by_device():
    assert Settings().worker_niceness("cpu") == 5 and Settings().worker_niceness("cuda") == 0
    assert Settings(worker_nice=0).worker_niceness("cpu") == 0
    assert Settings(worker_nice=3).worker_niceness("cuda") == 3
    with pytest.raises(ValueError):
        Settings(worker_nice=20)


def test_cors_preflight():
    app = create_app(Settings(model_dirs=["/nonexistent"], cors_origins=["https://ui.example"]))
    client = TestClient(app)  # no lifespan: the preflight needs no model
    r = client.options("/v1/translate", headers={"Origin": "https://ui.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://ui.example"


def test_every_setting_is_in_the_configuration_table():
    """docs/configuration.md names every variable Settings reads, with its default where the row
    is one variable's."""
    table = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| `NMT_")}
    missing = [name for name in Settings.model_fields
               if not any(f"`NMT_{name.upper()}`" in variables for variables in rows)]
    assert not missing, f"not in docs/configuration.md: {', '.join('NMT_' + m.upper() for m in missing)}"
    for name in ("max_attention_values", "client_alignment_bytes", "max_key_failures", "client_file_bytes"):
        default = Settings.model_fields[name].default
        assert f"| `{default}` |" in rows[f"`NMT_{name.upper()}`"], name
