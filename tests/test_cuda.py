"""The CUDA paths, each against its CPU twin: a tiny model decodes the same tokens on the GPU as on
the CPU in float32, runs in float16 and bfloat16 with attention, and the service's worker serves
it on the GPU. Skipped where torch sees no CUDA device; scripts/gpu-check.sh runs them
(`pytest -m cuda`) when a GPU is lent."""

from __future__ import annotations

import pytest
import torch

from app.settings import Settings
from model.translator import Translator
from tests.conftest import ready_client

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (scripts/gpu-check.sh)")]

SENTENCES = ["Open the file and save your changes.", "Click the button to print the document.", "Hello world."]


def test_float32_on_the_gpu_decodes_what_the_cpu_decodes(tiny_sentinel_checkpoint):
    cpu = Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32")
    gpu = Translator.load(tiny_sentinel_checkpoint, device="cuda", dtype="float32")
    for beam in (1, 4):
        on_cpu = cpu.translate(SENTENCES, beam_size=beam, n_best=beam)
        on_gpu = gpu.translate(SENTENCES, beam_size=beam, n_best=beam)
        for a, b in zip(on_cpu, on_gpu):
            assert [h.token_ids for h in a.hypotheses] == [h.token_ids for h in b.hypotheses]
            assert [h.score for h in a.hypotheses] == pytest.approx([h.score for h in b.hypotheses], abs=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_with_attention(tiny_sentinel_checkpoint, dtype):
    gpu = Translator.load(tiny_sentinel_checkpoint, device="cuda", dtype=dtype)
    results = gpu.translate(SENTENCES, beam_size=4, return_attention=True)
    for result in results:
        best = result.hypotheses[0]
        assert torch.isfinite(torch.tensor(best.score))
        attention = torch.as_tensor(best.attention)  # (layers, heads, target, source)
        assert attention.shape[-2] == len(best.token_ids) + best.ended_with_eos and torch.isfinite(attention).all()


def test_the_service_worker_serves_on_the_gpu(tiny_sentinel_checkpoint):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], device="cuda", dtype="auto", max_wait_ms=2)
    with ready_client(settings) as client:
        r = client.post("/v1/translate", json={"text": SENTENCES, "source": "en", "target": "de", "alignments": True})
        assert r.status_code == 200, r.text
        assert all(t["alignment_id"] for t in r.json()["translations"])
        model = client.get("/v1/models").json()["models"][0]
        assert model["device"] == "cuda" and model["dtype"] in ("bfloat16", "float16")
