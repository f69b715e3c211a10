"""The service with running batches in its workers (NMT_RUNNING_BATCH=true; here on the CPU
its eager twin): concurrent requests of every kind get what the batch-by-batch
service gives them, each request answered when its own sentences are done."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.conftest import running_server

pytestmark = pytest.mark.e2e

TEXTS = ["Open the file.", "Click {name} to print %s documents and save your changes to the disk now.",
         "Hello world.", "Save the file to /tmp/out.txt or mail it to ada@example.com.", "PRINT THE DOCUMENT.",
         "&Save", "Print."]
# (body fields): beams and alternatives, the attention inline and stored, a glossary (the pipeline
# reads the attention's mean), a repetition penalty (batch by batch even here), a length cap
SETTINGS = [{"beam_size": 4, "n_best": 2}, {"beam_size": 1}, {"beam_size": 3, "include_attention": True},
            {"beam_size": 2, "alignments": True}, {"beam_size": 2, "glossary": {"file": "Akte"}},
            {"beam_size": 2, "repetition_penalty": 1.5}, {"beam_size": 2, "max_length": 4}]


def assert_close(got, expected, where="") -> None:
    """Equal, floats (scores, attention weights) within 2e-4: the two engines sum in other orders."""
    if isinstance(expected, float):
        assert got == pytest.approx(expected, abs=2e-4), where
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_close(g, e, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), where
        for k in expected:
            assert_close(got[k], expected[k], f"{where}.{k}")
    else:
        assert got == expected, where


def answers(url: str) -> list:
    async def fire():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            requests = [client.post("/v1/translate", json={"text": text, "source": "en", "target": "de", **fields})
                        for fields in SETTINGS for text in TEXTS]
            return await asyncio.gather(*requests)

    out = []
    for r in asyncio.run(fire()):
        assert r.status_code == 200, r.text
        [t] = r.json()["translations"]
        t.pop("alignment_id", None)  # a stored alignment's id: new each time
        for alternative in t.get("alternatives") or []:
            alternative.pop("alignment_id", None)
        out.append(t)
    return out


def test_running_batches_answer_as_the_batch_by_batch_service(tiny_sentinel_checkpoint):
    env = {"NMT_MODEL_DIRS": str(tiny_sentinel_checkpoint), "NMT_WORKERS": "1", "NMT_THREADS_PER_WORKER": "1",
           "NMT_DTYPE": "float32", "NMT_CACHE": "false", "NMT_SHORTLIST": "false", "NMT_DETECT_LANGUAGES": "none"}
    results = {}
    # batch by batch; running batches joined at every step; joined in groups of 3 (or after 2 steps)
    for mode, join in (("false", ("1", "0")), ("true", ("1", "0")), ("true", ("3", "2"))):
        with running_server({**env, "NMT_RUNNING_BATCH": mode, "NMT_RUNNING_SLOTS": "4",
                             "NMT_RUNNING_JOIN_GROUP": join[0], "NMT_RUNNING_JOIN_WAIT": join[1]}) as (url, _):
            results[mode, join] = answers(url)
            worker = httpx.get(f"{url}/ready").json()["workers"][0]
            assert worker["restarts"] == 0 and worker["cancelled"] == 0
    batch_by_batch = results["false", ("1", "0")]
    for running in (results["true", ("1", "0")], results["true", ("3", "2")]):
        assert sum("attention" in t for t in running) == len(TEXTS)
        assert_close(running, batch_by_batch)
