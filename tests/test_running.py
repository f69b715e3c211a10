"""model/running.py: sentences that join a running batch at step boundaries and leave it when
done get the hypotheses beam_search gives each alone (the CPU twin of the GPU step: capture=False)."""

import pytest
import torch

from model.graphs import GraphedBeamSearch
from model.running import RunningBatch
from model.search import beam_search
from tests.test_search import EOS, tiny


def sentence(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 40, (length - 1,), generator=g).tolist() + [EOS]


def alone(model, ids, beam, cap, attention=False):
    [hypotheses] = beam_search(model, torch.tensor([ids]), beam, beam, max_new_tokens=cap, return_attention=attention)
    return hypotheses


def same(got, expected):
    assert [h.token_ids for h in got] == [h.token_ids for h in expected]
    assert [h.ended_with_eos for h in got] == [h.ended_with_eos for h in expected]
    assert [h.score for h in got] == pytest.approx([h.score for h in expected], abs=1e-5)
    assert [h.log_prob for h in got] == pytest.approx([h.log_prob for h in expected], abs=1e-5)


@pytest.mark.parametrize("beam", [1, 4])
def test_sentences_joining_and_leaving_get_what_they_get_alone(beam):
    model = tiny(eos_bias=0.0)
    search = GraphedBeamSearch(model, capture=False)
    # (key, source, cap): more sentences than slots, of different lengths and caps, so that some
    # wait for a slot, join while others are half done, and the ring of candidates wraps around
    arrivals = [(i, sentence(i, 1 + (7 * i) % 19), 5 + (11 * i) % 28) for i in range(14)]
    batch = RunningBatch(search, slots=4, beam_size=beam, source_len=32, capacity=32)
    waiting, results, joined_late = list(arrivals), {}, 0
    batch.admit(waiting[:2])  # two now, the rest a few at a time
    waiting = waiting[2:]
    while batch.running or waiting:
        for key, hypotheses in batch.step():
            assert key not in results
            results[key] = hypotheses
        if batch.steps % 3 == 0 and waiting and batch.free:
            joined_late += bool(batch.running)
            n = min(batch.free, len(waiting))
            batch.admit(waiting[:n])
            waiting = waiting[n:]
    assert batch.steps > 32 and joined_late > 3  # the ring wrapped; sentences joined a running batch
    assert sorted(results) == [key for key, *_ in arrivals]
    for key, ids, cap in arrivals:
        same(results[key], alone(model, ids, beam, cap))
    batch.close()


def test_attention_follows_each_hypothesis():
    model = tiny(eos_bias=0.0)
    batch = RunningBatch(GraphedBeamSearch(model, capture=False), slots=2, beam_size=3, source_len=32, capacity=32,
                         attention=True)
    items = [("a", sentence(1, 9), 12), ("b", sentence(2, 4), 20), ("c", sentence(3, 13), 9)]
    batch.admit(items[:2])
    results = {}
    while batch.running:
        results.update(batch.step())
        if results and "c" not in batch.key and "c" not in results:  # joins when the first one leaves
            assert batch.running == 1
            batch.admit(items[2:])
    for key, ids, cap in items:
        expected = alone(model, ids, 3, cap, attention=True)
        same(results[key], expected)
        for got, want in zip(results[key], expected):
            assert got.attention.shape == want.attention.shape  # (L, H, T, this source's length)
            torch.testing.assert_close(got.attention, want.attention, atol=1e-5, rtol=1e-4)


def test_what_does_not_fit_is_refused():
    batch = RunningBatch(GraphedBeamSearch(tiny(), capture=False), slots=2, beam_size=2, source_len=32, capacity=32)
    with pytest.raises(ValueError, match="free slots"):
        batch.admit([(i, sentence(i, 3), 5) for i in range(3)])
    with pytest.raises(ValueError, match="longer than this batch takes"):
        batch.admit([("long", sentence(0, 40), 5)])
    with pytest.raises(ValueError, match="longer than this batch takes"):
        batch.admit([("long cap", sentence(0, 4), 33)])
    assert batch.step() == [] and batch.free == 2
