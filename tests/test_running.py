"""model/running.py: sentences that join a running batch at step boundaries and leave it when
done get the hypotheses beam_search gives each alone: RunningBatch (the GPU's fixed-shape step,
here its CPU twin: capture=False) and EagerRunningBatch (the model's own step: the CPU's)."""

import pytest
import torch

from model import kernels
from model.graphs import GraphedBeamSearch
from model.running import EagerRunningBatch, RunningBatch
from model.search import beam_search, select
from model.transformer import DecoderCache, Transformer
from tests.test_search import EOS, tiny


def sentence(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 40, (length - 1,), generator=g).tolist() + [EOS]


def alone(model, ids, beam, cap, attention=False, select_fn=select):
    [hypotheses] = beam_search(model, torch.tensor([ids]), beam, beam, max_new_tokens=cap, return_attention=attention,
                               select_fn=select_fn)
    return hypotheses


def kernel_model(seed=0):
    """tiny's arithmetic through the C++ attention (a head size it takes) and search step."""
    if not kernels.available():
        pytest.skip("the C++ kernels are not built")
    reference = tiny(eos_bias=0.0, seed=seed, d_model=4 * kernels.loaded().vector_size, n_heads=4)
    model = Transformer(reference.config, kernels.decoder_attention).eval()
    model.load_state_dict(reference.state_dict())
    return model


def same(got, expected):
    assert [h.token_ids for h in got] == [h.token_ids for h in expected]
    assert [h.ended_with_eos for h in got] == [h.ended_with_eos for h in expected]
    assert [h.score for h in got] == pytest.approx([h.score for h in expected], abs=1e-5)
    assert [h.log_prob for h in got] == pytest.approx([h.log_prob for h in expected], abs=1e-5)


# (key, source, cap): more sentences than slots, of different lengths and caps, so that some wait
# for a slot and join while others are half done
ARRIVALS = [(i, sentence(i, 1 + (7 * i) % 19), 5 + (11 * i) % 28) for i in range(14)]


def decode_arriving(batch) -> tuple[dict, int]:
    """ARRIVALS through a running batch: two at first, the rest a few every third step while
    slots are free. Returns each key's hypotheses, and how many admissions joined sentences
    already running."""
    waiting, results, joined_late = list(ARRIVALS), {}, 0
    batch.admit(waiting[:2])
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
    assert sorted(results) == [key for key, *_ in ARRIVALS]
    return results, joined_late


def decode_with_attention(batch) -> dict:
    """Three sentences through a running batch of two slots that records attention: the third
    (the longest source) joins when the first leaves."""
    items = [("a", sentence(1, 9), 12), ("b", sentence(2, 4), 20), ("c", sentence(3, 13), 9)]
    batch.admit(items[:2])
    results = {}
    while batch.running:
        results.update(batch.step())
        if results and "c" not in batch.key and "c" not in results:
            assert batch.running == 1
            batch.admit(items[2:])
    return {key: (results[key], ids, cap) for key, ids, cap in items}


def same_attention(model, decoded, beam):
    for got, ids, cap in decoded.values():
        expected = alone(model, ids, beam, cap, attention=True)
        same(got, expected)
        for g, want in zip(got, expected):
            assert g.attention.shape == want.attention.shape  # (L, H, T, this source's length)
            torch.testing.assert_close(g.attention, want.attention, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_sentences_joining_and_leaving_get_what_they_get_alone(beam):
    model = tiny(eos_bias=0.0)
    batch = RunningBatch(GraphedBeamSearch(model, capture=False), slots=4, beam_size=beam, source_len=32, capacity=32)
    results, joined_late = decode_arriving(batch)
    assert batch.steps > 32 and joined_late > 3  # the ring of candidates wrapped; sentences joined a running batch
    for key, ids, cap in ARRIVALS:
        same(results[key], alone(model, ids, beam, cap))
    batch.close()


def test_attention_follows_each_hypothesis():
    model = tiny(eos_bias=0.0)
    batch = RunningBatch(GraphedBeamSearch(model, capture=False), slots=2, beam_size=3, source_len=32, capacity=32,
                         attention=True)
    same_attention(model, decode_with_attention(batch), 3)


@pytest.mark.parametrize("max_positions", [512, 40], ids=["source bucket", "bucket past the model's positions"])
def test_a_join_padded_to_a_power_of_two_writes_only_its_own_slots(max_positions):
    """A join of 3 runs as one of 4 (the last sentence twice, into its one slot, as the GPU's
    graph of 4 joiners does), each source padded to the bucket's length (or to the model's
    positions, where the bucket rounds up past them: 40 of 64): the sentences already running
    and the joiners decode as alone."""
    model = tiny(eos_bias=0.0, max_positions=max_positions)
    batch = RunningBatch(GraphedBeamSearch(model, capture=False), slots=8, beam_size=2, source_len=33, capacity=32)
    assert batch.bucket.source_len == 64
    first = [("a", sentence(1, 9), 20), ("b", sentence(2, 5), 20)]
    joiners = [("c", sentence(3, 13), 12), ("d", sentence(4, 4), 12), ("e", sentence(5, 7), 12)]
    batch.admit(first)
    results = {}
    for _ in range(3):
        results.update(batch.step())
    batch.admit(joiners)
    assert sorted(batch.buf.join_inputs) == [2, 4] and batch.running == 5
    while batch.running:
        results.update(batch.step())
    for key, ids, cap in first + joiners:
        same(results[key], alone(model, ids, 2, cap))


@pytest.mark.parametrize("engine", ["reference", "kernels"])
@pytest.mark.parametrize("beam", [1, 4])
def test_sentences_joining_and_leaving_an_eager_batch_get_what_they_get_alone(beam, engine, monkeypatch):
    model, select_fn = (tiny(eos_bias=0.0), select) if engine == "reference" else (kernel_model(), kernels.select)
    batch = EagerRunningBatch(model, slots=4, beam_size=beam, select_fn=select_fn)
    positions = []  # the rows' positions at each step
    step_positions = DecoderCache.step_positions

    def recorded(cache):
        positions.append(cache.position.tolist())
        return step_positions(cache)

    monkeypatch.setattr(DecoderCache, "step_positions", recorded)
    results, joined_late = decode_arriving(batch)
    monkeypatch.undo()
    assert joined_late > 3
    assert any(0 in p and max(p) > 3 for p in positions)  # a joiner at position 0 beside rows further on
    for key, ids, cap in ARRIVALS:
        same(results[key], alone(model, ids, beam, cap, select_fn=select_fn))
    assert batch.cache is None and not batch.history  # all gone with the last sentence


def test_an_eager_batch_returns_each_hypothesis_attention_along_its_beams():
    """The joiner's source is longer than those running: their keys/values are padded to it."""
    model = tiny(eos_bias=0.0)
    same_attention(model, decode_with_attention(EagerRunningBatch(model, slots=2, beam_size=3, attention=True)), 3)


def test_an_eager_batch_drops_what_nobody_waits_for():
    model = tiny(eos_bias=0.0)
    batch = EagerRunningBatch(model, slots=3, beam_size=2)
    items = [(i, sentence(i, 6 + i), 15) for i in range(3)]
    batch.admit(items)
    batch.step()
    batch.drop({1})
    assert batch.key == [0, 2] and batch.free == 1
    results = {}
    while batch.running:
        results.update(batch.step())
    assert sorted(results) == [0, 2]
    for key, ids, cap in (items[0], items[2]):
        same(results[key], alone(model, ids, 2, cap))
    with pytest.raises(ValueError, match="free slots"):
        batch.admit([(i, sentence(i, 3), 5) for i in range(4)])


def test_an_eager_batch_keeps_each_sources_keys_and_values_where_they_were_written():
    """Sentences joining and leaving move no one else's encoder-decoder keys/values: they sit in
    a pool, a joiner takes the entry of one that left, and the pool grows only when it is full."""
    model = tiny(eos_bias=0.0)
    batch = EagerRunningBatch(model, slots=3, beam_size=2)
    items = [(i, sentence(i, 5 + 3 * i), 15) for i in range(4)]
    batch.admit(items[:2])
    batch.step()
    assert batch.cache.entry is None  # the first sentences' own keys/values, not a pool yet
    batch.admit(items[2:3])
    pool, entry = batch.cache.cross_kv[0][0], batch.cache.entry
    assert entry.tolist() == [0, 1, 2] and pool.size(0) == 3
    batch.step()
    batch.drop({0})
    assert batch.cache.entry.tolist() == [1, 2]
    batch.admit(items[3:])  # the longest source: the pool grows to its length, and no more entries
    assert batch.cache.entry.tolist() == [1, 2, 0] and batch.cache.cross_kv[0][0].size(0) == 3
    assert batch.cache.cross_kv[0][0].size(2) == len(items[3][1])
    results = {}
    while batch.running:
        results.update(batch.step())
    assert sorted(results) == [1, 2, 3]
    for key, ids, cap in items[1:]:
        same(results[key], alone(model, ids, 2, cap))
    shorter = EagerRunningBatch(model, slots=3, beam_size=2)  # a joiner no longer than the pool: written in place
    shorter.admit([items[3], items[2]])
    shorter.step()
    shorter.drop({3})
    pool = shorter.cache.cross_kv[0][0]
    shorter.admit([items[0], items[1]])
    assert shorter.cache.cross_kv[0][0].data_ptr() != pool.data_ptr()  # three sources: the pool of two grew
    pool = shorter.cache.cross_kv[0][0]
    shorter.drop({0})
    shorter.admit([(9, sentence(9, 4), 15)])
    assert shorter.cache.cross_kv[0][0].data_ptr() == pool.data_ptr()


def test_an_eager_batch_decodes_over_the_shortlist_of_the_sentences_running():
    """With a vocabulary shortlist the logits' columns always cover every running sentence's
    pieces (joiners add theirs, the set is computed anew as sentences leave), hypotheses write only
    those; a shortlist of every id decodes as the whole vocabulary."""
    from model.shortlist import Shortlist

    model = tiny(eos_bias=0.0)
    g = torch.Generator().manual_seed(4)
    candidates = torch.randint(3, 40, (40, 3), generator=g)  # 3 target ids per source id
    candidates[::5, 2] = -1  # fewer for some
    shortlist = Shortlist(candidates, torch.tensor([3, 4, 5]), copy_source=False)
    sizes, written = [], set()

    class Checked(EagerRunningBatch):
        def step(self):
            if self.key:
                assert set(shortlist.columns(self.ids, [EOS]).tolist()) <= set(self.columns.tolist())
                sizes.append(self.columns.numel())
            return super().step()

    results, _ = decode_arriving(Checked(model, slots=4, beam_size=2, shortlist=shortlist))
    for hypotheses in results.values():
        for h in hypotheses:
            written |= set(h.token_ids)
    ever = set(shortlist.columns([ids for _, ids, _ in ARRIVALS], [EOS]).tolist())
    assert written <= ever and len(ever) < 40
    assert any(b < a for a, b in zip(sizes, sizes[1:]))  # computed anew after sentences left

    every = Shortlist(torch.arange(40).expand(40, 40), torch.tensor([0, 1, 2]), copy_source=False)
    results, _ = decode_arriving(EagerRunningBatch(model, slots=4, beam_size=2, shortlist=every))
    for key, ids, cap in ARRIVALS:
        same(results[key], alone(model, ids, 2, cap))


def test_what_does_not_fit_is_refused():
    batch = RunningBatch(GraphedBeamSearch(tiny(), capture=False), slots=2, beam_size=2, source_len=32, capacity=32)
    with pytest.raises(ValueError, match="free slots"):
        batch.admit([(i, sentence(i, 3), 5) for i in range(3)])
    with pytest.raises(ValueError, match="longer than this batch takes"):
        batch.admit([("long", sentence(0, 40), 5)])
    with pytest.raises(ValueError, match="longer than this batch takes"):
        batch.admit([("long cap", sentence(0, 4), 33)])
    assert batch.step() == [] and batch.free == 2


def test_a_batch_sets_up_its_buffers_in_inference_mode_as_the_searches_do():
    """Capturing the step runs it on the buffers: set up outside inference mode, the buffers (or
    the ones a Translator's search gave back) are modified in place in a mode they were not made
    in, and capture fails (the H100 run: the step ran eagerly at a third of the speed)."""
    search = GraphedBeamSearch(tiny(), capture=False)
    batch = RunningBatch(search, slots=2, beam_size=2, source_len=32, capacity=32)
    assert torch.is_inference_mode_enabled() is False
    assert all(t.is_inference() for t in (batch.buf.self_kv, batch.buf.cross_kv, batch.buf.live, batch.buf.step))
    batch.admit([("a", sentence(0, 3), 5)])
    batch.drop({"a"})  # in place on the buffers, from outside inference mode too
    assert batch.running == 0

@pytest.mark.parametrize("fixed_shape", [False, True], ids=["eager", "fixed-shape"])
def test_running_batches_answer_each_sentence_as_the_translator_decodes_it_alone(tiny_sentinel_checkpoint, fixed_shape):
    """Sentences of several shapes (beams, lengths, attention asked or only its mean) arrive while
    others run; each comes back as soon as it is done, as Translator.decode gives it alone."""
    from model.options import DecodingOptions
    from model.running import RunningBatches
    from model.translator import Translator

    translator = Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32", shortlist=False)
    texts = ["Open the file.", "Click {name} to print %s documents and save your changes to the disk now.",
             "Hello world.", "Save the file to /tmp/out.txt or mail it to ada@example.com.", "Print."]
    options = [DecodingOptions(beam_size=4, n_best=2, length_penalty=1.0), DecodingOptions(beam_size=1),
               DecodingOptions(beam_size=3, n_best=3, attention=True, max_length=9)]
    arrivals = [((i, j), translator.encode(text), o, i % 2 == 1)
                for i, o in enumerate(options) for j, text in enumerate(texts)]
    batches = RunningBatches(translator, slots=2, fixed_shape=fixed_shape)
    assert RunningBatches.takes(options[0]) and not RunningBatches.takes(DecodingOptions(min_length=2))
    results, steps, late = {}, 0, 0
    for tag, ids, o, weights in arrivals[:4]:
        batches.add(tag, ids, o, weights)
    waiting = arrivals[4:]
    while batches.busy or waiting:
        for tag, decoded in batches.step():
            assert tag not in results
            results[tag] = decoded
        steps += 1
        if steps % 2 == 0 and waiting:
            late += bool(batches.sentences)
            tag, ids, o, weights = waiting.pop(0)
            batches.add(tag, ids, o, weights)
    assert late > 5 and not batches.batches  # sentences joined running batches; the batches closed
    assert sorted(results) == sorted(tag for tag, *_ in arrivals)
    for tag, ids, o, weights in arrivals:
        [expected] = translator.decode([ids], o, weights)
        got = results[tag]
        assert [h.token_ids for h in got] == [h.token_ids for h in expected]
        assert [h.score for h in got] == pytest.approx([h.score for h in expected], abs=1e-5)
        for g, e in zip(got, expected):
            assert (g.weights is None) == (e.weights is None) and (g.attention is None) == (e.attention is None)
            if e.weights is not None:
                assert g.weights == pytest.approx(e.weights, abs=1e-5)


@pytest.mark.parametrize("fixed_shape", [False, True], ids=["eager", "fixed-shape"])
def test_sentences_join_a_running_batch_in_groups_when_asked(tiny_sentinel_checkpoint, fixed_shape):
    """join_group 3, join_wait 2: sentences that arrive while a batch runs wait for company (three
    of them, or two steps run without them); an empty batch takes them at once; each still
    decodes as alone (the tiny random model never writes EOS: every sentence runs to its cap)."""
    from model.options import DecodingOptions
    from model.running import RunningBatches
    from model.translator import Translator

    translator = Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32", shortlist=False)
    options = DecodingOptions(beam_size=2, max_length=12)
    ids = {tag: translator.encode(text) for tag, text in
           enumerate(["Open the file.", "Hello world.", "Print.", "Save the file now.", "Close it."])}
    batches = RunningBatches(translator, slots=8, fixed_shape=fixed_shape, join_group=3, join_wait=2)
    results = {}

    def step() -> int:
        results.update(batches.step())
        return len(batches.sentences)  # sentences in the batch

    batches.add(0, ids[0], options)
    assert step() == 1  # an empty batch takes a sentence at once
    batches.add(1, ids[1], options)
    assert step() == 1  # one waits: fewer than 3
    assert step() == 1  # and one step run without it
    assert step() == 2  # two steps without it: it joins
    batches.add(2, ids[2], options)
    batches.add(3, ids[3], options)
    assert step() == 2
    batches.add(4, ids[4], options)
    assert step() == 5  # three wait: they join together
    while batches.busy:
        step()
    for tag, source in ids.items():
        [expected] = translator.decode([source], options)
        assert [d.token_ids for d in results[tag]] == [d.token_ids for d in expected]


@pytest.mark.parametrize("fixed_shape", [False, True], ids=["eager", "fixed-shape"])
@pytest.mark.parametrize("budget", [2.0, 0.5], ids=["two-shapes", "under-one"])
def test_running_batches_keep_within_their_bytes_and_start_the_oldest_shape_first(tiny_sentinel_checkpoint,
                                                                                 fixed_shape, budget):
    """Each length penalty is a shape, and a batch, of its own (a client's choice): within a budget
    of two shapes' buffers two batches run at once, never more, and the shapes start in the order
    their sentences came; under one shape's, one batch runs at a time, whatever it needs. Each
    sentence still decodes as it does alone."""
    from model.options import DecodingOptions
    from model.running import RunningBatches
    from model.translator import Translator

    translator = Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32", shortlist=False)
    ids = translator.encode("Open the file.")
    options = [DecodingOptions(beam_size=2, length_penalty=0.5 + shape / 10, max_length=6) for shape in range(5)]
    probe = RunningBatches(translator, slots=2, fixed_shape=fixed_shape, max_bytes=0)
    probe.add("a", ids, options[0])
    probe.add("b", ids, options[0])
    probe.step()
    one_shape = probe.bytes_in_use()  # its batch's buffers (fixed shape), or what its two sentences count (eager)
    assert one_shape > 0
    batches = RunningBatches(translator, slots=2, fixed_shape=fixed_shape, max_bytes=int(budget * one_shape))
    for shape, o in enumerate(options):
        batches.add((shape, 0), ids, o)
        batches.add((shape, 1), ids, o)
    results, started, most = {}, [], 0
    while batches.busy:
        results.update(batches.step())
        most = max(most, len(batches.batches))
        assert batches.bytes_in_use() <= max(batches.max_bytes, one_shape)
        for shape, _ in sorted(batches.sentences):
            if shape not in started:
                started.append(shape)
    assert most == (2 if budget > 1 else 1) and started == list(range(5))
    for (shape, _), decoded in results.items():
        [expected] = translator.decode([ids], options[shape])
        assert [d.token_ids for d in decoded] == [d.token_ids for d in expected]


@pytest.mark.parametrize("fixed_shape", [False, True], ids=["eager", "fixed-shape"])
def test_a_failing_batch_fails_its_own_sentences_only(tiny_sentinel_checkpoint, monkeypatch, fixed_shape):
    from model.options import DecodingOptions
    from model.running import RunningBatches
    from model.translator import Translator

    translator = Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32", shortlist=False)
    batches = RunningBatches(translator, slots=2, fixed_shape=fixed_shape)
    kind = RunningBatch if fixed_shape else EagerRunningBatch
    greedy, beam = DecodingOptions(beam_size=1), DecodingOptions(beam_size=2)
    for i in range(3):  # one waits for a slot
        batches.add(("greedy", i), translator.encode("Open the file."), greedy)
    batches.add(("beam", 0), translator.encode("Open the file."), beam)
    real_step = kind.step

    def step(self):
        if self.k == 1:
            raise RuntimeError("injected")
        return real_step(self)

    monkeypatch.setattr(kind, "step", step)
    results = {}
    while batches.busy:
        results.update(batches.step())
    assert {tag for tag, r in results.items() if isinstance(r, RuntimeError)} == {("greedy", i) for i in range(3)}
    assert results[("beam", 0)][0].token_ids == translator.decode([translator.encode("Open the file.")], beam)[0][0].token_ids


@pytest.mark.parametrize("fixed_shape", [False, True], ids=["eager", "fixed-shape"])
def test_cancelled_sentences_leave_their_slots_and_the_rest_decode_as_alone(tiny_sentinel_checkpoint, fixed_shape):
    from model.options import DecodingOptions
    from model.running import RunningBatches
    from model.translator import Translator

    translator = Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32", shortlist=False)
    options = DecodingOptions(beam_size=2, max_length=20)
    ids = [translator.encode(t) for t in ["Open the file.", "Hello world.", "Print the document now.", "Save."]]
    batches = RunningBatches(translator, slots=2, fixed_shape=fixed_shape)
    for i, x in enumerate(ids):
        batches.add(i, x, options)
    batches.step()  # 0 and 1 run, 2 and 3 wait
    batches.cancel({1, 3})  # one running, one waiting
    [batch] = batches.batches.values()
    assert batch.running == 1 and batch.free == 1
    results = {}
    while batches.busy:
        results.update(batches.step())
    assert sorted(results) == [0, 2]
    for i in (0, 2):
        [expected] = translator.decode([ids[i]], options)
        assert [h.token_ids for h in results[i]] == [h.token_ids for h in expected]
