"""The HTTP process stays free of torch: the workers own the model and the device, and the
server reads checkpoints' headers, tokenizes and routes (app/worker_process.py is torch's only door)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

SERVE_AND_TRANSLATE = textwrap.dedent("""
    import sys, time
    from fastapi.testclient import TestClient
    from app.main import create_app
    from app.settings import Settings

    settings = Settings(model_dirs=[sys.argv[1]], workers=1, threads_per_worker=1, max_wait_ms=1)
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = client.post("/v1/translate", json={"text": "Open %s now.", "source": "en", "target": "de",
                                                "alignments": True, "include_attention": True})
        assert r.status_code == 200, r.text
        assert r.json()["translations"][0]["text"].count("%s") == 1
        alignment = client.get("/v1/alignments/" + r.json()["translations"][0]["alignment_id"] + "?granularity=word")
        assert alignment.status_code == 200, alignment.text
        assert client.get("/v1/models").json()["models"][0]["dtype"] != "auto"  # what the worker resolved
    assert "torch" not in sys.modules, "the server process imported torch"
""")


def test_server_process_never_imports_torch(tiny_sentinel_checkpoint):
    run = subprocess.run([sys.executable, "-c", SERVE_AND_TRANSLATE, str(tiny_sentinel_checkpoint)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def test_nmt_serve_parses_without_loading_the_model_commands():
    code = ("import sys; from nmt.cli import main\n"
            "try:\n    main(['serve', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'training' not in sys.modules")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "--model" in run.stdout


def test_a_worker_loads_its_translators_with_the_pipelined_search_when_asked(monkeypatch):
    """NMT_PIPELINED_STEPS reaches Translator.load in the worker (where, on a GPU, it sets the
    graphed search's `pipelined`; on the CPU there is no graphed search to see it on)."""
    from app import worker_process

    asked = []
    monkeypatch.setattr(worker_process.Translator, "load", classmethod(lambda cls, *a, **kw: asked.append(kw)))
    worker_process.Translators({"a": "dir-a", "b": "dir-b"}, "cpu", "float32", pipelined_steps=True)
    worker_process.Translators({"a": "dir-a"}, "cpu", "float32")
    assert [kw["pipelined_steps"] for kw in asked] == [True, True, False]
