"""scripts/gpu-check.sh on a machine without CUDA: it says so, checks that each of its steps would
run (the GPU benchmark on the CPU, the CUDA tests collected, the service benchmark's options, the
running batch's benchmark on the CPU twin) and
exits 0, so the script that a lent GPU runs is known to work before the GPU is there."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real check")
def test_gpu_check_checks_itself_without_cuda(tmp_path):
    run = subprocess.run(["bash", "scripts/gpu-check.sh", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "no CUDA device here" in run.stdout
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.count("exit 0") == 4, summary
    table = (tmp_path / "bench-check" / "engine.md").read_text()
    assert "| ours | float32 | 4 | 2 |" in table and "| hf | float32 | 4 | 2 |" in table
    running = (tmp_path / "running-engine.txt").read_text()
    assert "| running batch, closed loop, join 1:0 |" in running and "| RunningBatch.step |" in running, running
    collected = (tmp_path / "cuda-tests-collected.txt").read_text()
    assert "12 tests collected" in collected and "test_cuda_graphs_decode_what_the_eager_step_decodes[float16]" in collected
    assert "test_the_pipelined_graphed_search_decodes_what_the_eager_step_decodes" in collected
    assert "test_decoding_never_runs_cudnns_attention[running batches]" in collected
