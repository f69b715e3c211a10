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
    results = gpu.translate(SENTENCES, beam_size=4, attention=True)
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


def many_sentences():
    """SENTENCES and their recombinations: ~60 sources of 1 to ~40 pieces."""
    words = " ".join(SENTENCES).rstrip(".").replace(".", "").split()
    return [" ".join(words[i: i + n]) + "." for n in (1, 3, 6, 10) for i in range(0, len(words), 1)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_graphs_decode_what_the_eager_step_decodes(tiny_sentinel_checkpoint, dtype):
    from model.graphs import GraphedBeamSearch

    eager = Translator.load(tiny_sentinel_checkpoint, device="cuda", dtype=dtype, cuda_graphs=False)
    graphed = Translator.load(tiny_sentinel_checkpoint, device="cuda", dtype=dtype)
    assert isinstance(graphed.graphed_search, GraphedBeamSearch) and graphed.graphed_search.capture
    assert eager.graphed_search is None
    sources = many_sentences()
    same, total = 0, 0
    for beam, attention in ((1, False), (4, False), (4, True)):
        a = eager.translate(sources, beam_size=beam, n_best=beam, attention=attention, batch_tokens=2048)
        b = graphed.translate(sources, beam_size=beam, n_best=beam, attention=attention, batch_tokens=2048)
        for ra, rb in zip(a, b):
            total += 1
            same += [h.token_ids for h in ra.hypotheses] == [h.token_ids for h in rb.hypotheses]
            if attention and ra.hypotheses[0].token_ids == rb.hypotheses[0].token_ids:
                assert rb.hypotheses[0].attention.shape == ra.hypotheses[0].attention.shape
                torch.testing.assert_close(rb.hypotheses[0].attention, ra.hypotheses[0].attention,
                                           atol=2e-2 if dtype != "float32" else 1e-4, rtol=0)
    # every bucket's step was captured and replayed, not run eagerly after a failed capture
    buffers = [b for free in graphed.graphed_search._free.values() for b in free]
    assert buffers and all(b.graphs and not b.eager for b in buffers)
    if dtype == "float32":
        assert same == total
    else:
        assert same >= 0.99 * total, f"{same} of {total} sentences decode the same"


def test_the_pipelined_graphed_search_decodes_what_the_eager_step_decodes(tiny_sentinel_checkpoint):
    """NMT_PIPELINED_STEPS on a GPU: the host reads each step's flags from pinned memory behind the
    next step (GraphedBeamSearch.pipelined); in float32 every sentence the same as the eager step."""
    eager = Translator.load(tiny_sentinel_checkpoint, device="cuda", dtype="float32", cuda_graphs=False)
    pipelined = Translator.load(tiny_sentinel_checkpoint, device="cuda", dtype="float32", pipelined_steps=True)
    assert pipelined.graphed_search.pipelined and pipelined.graphed_search.capture
    sources = many_sentences()
    for beam, attention in ((1, False), (4, False), (4, True)):
        a = eager.translate(sources, beam_size=beam, n_best=beam, attention=attention, batch_tokens=2048)
        b = pipelined.translate(sources, beam_size=beam, n_best=beam, attention=attention, batch_tokens=2048)
        assert [[h.token_ids for h in r.hypotheses] for r in b] == [[h.token_ids for h in r.hypotheses] for r in a]
        for ra, rb in zip(a, b):
            torch.testing.assert_close(torch.tensor([h.score for h in rb.hypotheses]),
                                       torch.tensor([h.score for h in ra.hypotheses]), atol=1e-4, rtol=0)
            if attention:
                torch.testing.assert_close(rb.hypotheses[0].attention, ra.hypotheses[0].attention, atol=1e-4, rtol=0)


def test_a_running_batch_on_the_gpu_decodes_each_sentence_as_it_decodes_alone(tiny_sentinel_checkpoint):
    """model/running.py with its step and its joins captured: sentences join a running batch
    mid-way and leave when done, each with the hypotheses beam_search gives it alone (float32)."""
    from model.graphs import GraphedBeamSearch
    from model.running import RunningBatch
    from model.search import beam_search

    translator = Translator.load(tiny_sentinel_checkpoint, device="cuda", dtype="float32", cuda_graphs=False)
    ids = [translator.encode(s) for s in many_sentences()[:24]]
    batch = RunningBatch(GraphedBeamSearch(translator.model), slots=8, beam_size=4, source_len=32, capacity=64)
    assert batch.buf.graphs and not batch.buf.eager
    waiting, results = [(i, x, 20) for i, x in enumerate(ids)], {}
    while waiting or batch.running:
        n = min(batch.free, len(waiting), 3)
        batch.admit(waiting[:n])
        waiting = waiting[n:]
        results.update(batch.step())
    assert batch.buf.join_graphs and not batch.buf.eager_joins  # the joins replayed graphs too
    for i, x in enumerate(ids):
        [expected] = beam_search(translator.model, torch.tensor([x], device="cuda"), 4, 4, max_new_tokens=20)
        assert [h.token_ids for h in results[i]] == [h.token_ids for h in expected]


def test_the_gpu_service_with_running_batches_answers_as_batch_by_batch(tiny_sentinel_checkpoint):
    """NMT_RUNNING_BATCH=true: the worker's running batches, each step a replayed
    graph, give every request what the batch-by-batch worker gives it (float32)."""
    from concurrent.futures import ThreadPoolExecutor

    bodies = [{"text": s, "source": "en", "target": "de", "beam_size": beam, "n_best": min(beam, 2)}
              for s in many_sentences()[:16] for beam in (1, 4)]
    answers = {}
    for running in ("true", "false"):
        settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], device="cuda", dtype="float32", cache=False,
                            detect_languages=["none"], running_batch=running)
        with ready_client(settings) as client, ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda body: client.post("/v1/translate", json=body), bodies))
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
        answers[running] = [[t["text"]] + [a["text"] for a in t.get("alternatives") or []]
                            for r in replies for t in r.json()["translations"]]
    assert answers["true"] == answers["false"]


@pytest.mark.parametrize("path", ["translate", "running batches"])
def test_decoding_never_runs_cudnns_attention(tiny_sentinel_checkpoint, path):
    """cuDNN's fused attention builds a graph on the host for each new shape (~1.5 ms of CPU a
    call on an H200 with torch 2.11, against ~10 us of GPU): a running batch encoding each join
    spent 83% of its loop there. Neither the Translator nor the running batches pick it, in
    half precision where PyTorch would."""
    from torch.profiler import ProfilerActivity, profile

    from model.options import DecodingOptions
    from model.running import RunningBatches

    translator = Translator.load(tiny_sentinel_checkpoint, device="cuda", dtype="float16")
    sources = many_sentences()[:12]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        if path == "translate":
            for s in sources:
                translator.translate([s])
        else:
            batches = RunningBatches(translator, slots=8)
            for i, s in enumerate(sources):
                batches.add(i, translator.encode(s), DecodingOptions(beam_size=4))
            done = []
            while batches.busy:
                done += batches.step()
            assert sorted(tag for tag, _ in done) == list(range(len(sources)))
    ops = {e.key for e in prof.key_averages()}
    assert any("attention" in op for op in ops), sorted(ops)  # the profile saw attention at all
    assert not [op for op in ops if "cudnn_attention" in op], sorted(ops)
