"""The fixed-shape search step of model/graphs.py (what a CUDA graph replays), run eagerly on the
CPU: the same hypotheses, scores and attention as model/search.py's beam_search over the
Transformer's own step, with the batch padded to its bucket, beams reordered in place and
finished sentences stopped where they are."""

import threading

import pytest
import torch

from model.graphs import GraphedBeamSearch, round_up_length, round_up_sentences
from model.search import beam_search
from tests.test_search import EOS, PAD, tiny


def mixed_sources(n=5, seed=3):
    """n sentences of very different lengths (1 to 19 tokens), so that they finish at different steps."""
    g = torch.Generator().manual_seed(seed)
    lengths = [19, 3, 11, 1, 7, 15, 2][:n]
    src = torch.randint(4, 40, (n, max(lengths)), generator=g)
    for row, length in enumerate(lengths):
        src[row, length - 1] = EOS
        src[row, length:] = PAD
    return src


def same(a, b):
    assert [[h.token_ids for h in r] for r in a] == [[h.token_ids for h in r] for r in b]
    assert [[h.ended_with_eos for h in r] for r in a] == [[h.ended_with_eos for h in r] for r in b]
    for ra, rb in zip(a, b):
        assert [h.score for h in ra] == pytest.approx([h.score for h in rb], abs=1e-5)


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("beam,n_best", [(1, 1), (4, 1), (4, 4), (5, 2)])
def test_the_fixed_shape_step_decodes_as_the_transformer(beam, n_best, pipelined):
    model = tiny(eos_bias=0.0)
    src = mixed_sources()
    caps = torch.tensor([30, 5, 20, 3, 12])  # sentences stopped by their caps at different steps
    graphed = GraphedBeamSearch(model, capture=False)
    graphed.pipelined = pipelined  # the host reads each step's flags a step late, and reorders every step
    for max_new in (caps, 17):
        expected = beam_search(model, src, beam, n_best, max_new_tokens=max_new)
        got = graphed(src, beam, n_best, max_new_tokens=max_new)
        same(expected, got)
        # some sentences finished early and left the batch while others went on
        lengths = {len(h.token_ids) + h.ended_with_eos for r in got for h in r}
        assert len(lengths) > 1


@pytest.mark.parametrize("pipelined", [False, True])
def test_attention_follows_each_hypothesis_as_the_transformers_does(pipelined):
    model = tiny(eos_bias=0.0)
    src = mixed_sources()
    expected = beam_search(model, src, 4, 3, max_new_tokens=12, return_attention=True)
    graphed = GraphedBeamSearch(model, capture=False)
    graphed.pipelined = pipelined
    got = graphed(src, 4, 3, max_new_tokens=12, return_attention=True)
    same(expected, got)
    for ra, rb in zip(expected, got):
        for ha, hb in zip(ra, rb):
            assert hb.attention.shape == ha.attention.shape  # (L, H, T, this source's length), not the bucket's
            torch.testing.assert_close(hb.attention, ha.attention, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pipelined", [False, True])
def test_min_length_and_one_sentence(pipelined):
    model = tiny(eos_bias=2.0)
    src = mixed_sources(1)
    expected = beam_search(model, src, 4, 1, max_new_tokens=10, min_new_tokens=6)
    graphed = GraphedBeamSearch(model, capture=False)
    graphed.pipelined = pipelined
    got = graphed(src, 4, 1, max_new_tokens=10, min_new_tokens=6)
    same(expected, got)
    assert len(got[0][0].token_ids) >= 5


def test_a_pipelined_search_runs_one_step_past_its_end_and_that_step_changes_nothing():
    """EOS comes early (all done at ~step 2 of 20): the pipelined host learns it a step late, so
    one more step runs, over done sentences only, and the hypotheses are the usual search's."""
    model = tiny(eos_bias=4.0)
    src = mixed_sources(3)
    expected = beam_search(model, src, 4, 2, max_new_tokens=20)
    steps_run = {}
    for pipelined in (False, True):
        graphed = GraphedBeamSearch(model, capture=False)
        graphed.pipelined = pipelined
        same(expected, graphed(src, 4, 2, max_new_tokens=20))
        [buffers] = [b for free in graphed._free.values() for b in free]
        steps_run[pipelined] = int(buffers.step)
    assert steps_run[True] == steps_run[False] + 1 < 20, steps_run


def test_buffers_are_reused_per_bucket_and_never_shared_by_two_searches():
    model = tiny(eos_bias=0.0)
    graphed = GraphedBeamSearch(model, capture=False)
    src = mixed_sources(3)
    expected = beam_search(model, src, 4, 2, max_new_tokens=15)
    assert not graphed._free
    same(graphed(src, 4, 2, max_new_tokens=15), expected)
    [(bucket, [buffers])] = graphed._free.items()  # given back when the search ended
    assert (bucket.sentences, bucket.beams, bucket.source_len, bucket.capacity) == (4, 4, 32, 32)
    same(graphed(src, 4, 2, max_new_tokens=15), expected)
    assert graphed._free[bucket] == [buffers]  # taken again, not made anew

    # searches on several threads at once each take their own buffers
    results, start = [None] * 4, threading.Barrier(4)

    def search(i):
        start.wait()
        results[i] = graphed(src, 4, 2, max_new_tokens=15)

    threads = [threading.Thread(target=search, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for got in results:
        same(got, expected)
    assert len(graphed._free[bucket]) >= 2
    with pytest.raises(ValueError, match="at most"):
        graphed(src, 4, 1, max_new_tokens=model.config.max_positions + 1)


def test_bucket_sizes():
    assert [round_up_sentences(n) for n in (1, 2, 3, 5, 32, 33)] == [1, 2, 4, 8, 32, 64]
    assert [round_up_length(n) for n in (1, 32, 33, 100, 512, 513, 1100)] == [32, 32, 64, 128, 512, 1024, 1536]


def test_capture_is_refused_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    with pytest.raises(ValueError, match="CUDA"):
        GraphedBeamSearch(tiny(), capture=True)


def test_the_translator_translates_the_same_through_the_graphed_search(tiny_sentinel_checkpoint):
    """The CPU twin of the Translator on a GPU: texts with protected spans (put back by the
    attention), alternatives and alignments come out as the usual search gives them."""
    from model.translator import Translator

    usual = Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32", shortlist=False)
    graphed = Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32", shortlist=False)
    graphed.graphed_search = GraphedBeamSearch(graphed.model, capture=False)
    texts = ["Open the file and save your changes.", "Click {name} to print %s documents.", "Hello world.",
             "Save the file to /tmp/out.txt or mail it to ada@example.com."]
    for beam, n_best, attention in ((1, 1, False), (4, 2, True)):
        a = usual.translate(texts, beam_size=beam, n_best=n_best, attention=attention)
        b = graphed.translate(texts, beam_size=beam, n_best=n_best, attention=attention)
        assert [[h.text for h in r.hypotheses] for r in a] == [[h.text for h in r.hypotheses] for r in b]
        if attention:
            for ra, rb in zip(a, b):
                torch.testing.assert_close(rb.hypotheses[0].attention, ra.hypotheses[0].attention, atol=1e-5, rtol=1e-4)


def test_free_buffers_past_the_byte_budget_are_dropped():
    graphed = GraphedBeamSearch(tiny(eos_bias=0.0), capture=False)
    graphed(mixed_sources(5), 4, 1, max_new_tokens=15)
    [[buffers]] = graphed._free.values()
    graphed.keep_bytes = buffers.nbytes  # room for this set (8 sentences)
    graphed(mixed_sources(3), 4, 1, max_new_tokens=15)  # another bucket (4 sentences): both do not fit
    assert [b.sentences for b in graphed._free] == [4]  # the least recently used went
    graphed.release()  # what a worker does after running out of memory
    assert not graphed._free
