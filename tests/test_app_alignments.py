"""The alignment store's bounds and the word / selection / hard-alignment views, alone."""

from __future__ import annotations

import asyncio

import numpy as np
from numpy.testing import assert_allclose

from app.alignments import Alignment, AlignmentStore, hard_alignment, select, to_float16, to_words, words
from app.storage import MemoryStorage


def attention(layers=2, heads=3, target=4, source=5, seed=0) -> np.ndarray:
    x = np.exp(np.random.default_rng(seed).random((layers, heads, target, source), dtype=np.float32))
    return x / x.sum(-1, keepdims=True)


def entry(target=4, source=5) -> Alignment:
    return Alignment("en-de", [f"s{i}" for i in range(source)], [f"t{i}" for i in range(target)],
                     attention(target=target, source=source))


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def memory_store(max_items=100, max_bytes=1 << 30, ttl_s=60.0, clock=None) -> AlignmentStore:
    storage = MemoryStorage({"alignment": max_bytes}, clock or Clock(), max_items={"alignment": max_items})
    return AlignmentStore(storage, ttl_s, max_bytes)


def test_alignment_round_trips_as_float16():
    stored = entry()
    back = Alignment.from_bytes(stored.to_bytes())
    assert (back.model, back.source_tokens, back.target_tokens) == (stored.model, stored.source_tokens,
                                                                    stored.target_tokens)
    assert back.attention.dtype == np.float32 and back.attention.shape == stored.attention.shape
    assert_allclose(back.attention, stored.attention, atol=5e-4)
    assert len(stored.to_bytes()) < stored.attention.nbytes // 2 + 200  # half of float32, and a header


def test_float16_rounding_is_numpys_cast_bit_for_bit():
    """Every float16 value, the halfway points between neighbours (ties go to the even one) and the
    float32 values on either side of each, with both signs; then every 9973rd float32 bit pattern."""
    every_half = np.arange(1 << 15, dtype=np.uint16).view(np.float16).astype(np.float64)
    finite = every_half[np.isfinite(every_half)]
    halfway = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)  # exact: 12 significant bits
    halfway = np.concatenate([halfway, np.float32(65520)[None]])  # past float16's largest: infinity
    near = np.concatenate([finite.astype(np.float32), halfway, np.nextafter(halfway, np.float32(0)),
                           np.nextafter(halfway, np.float32(np.inf)), np.float32([1e-30, 1e-45, 1e30, np.inf])])
    spread = np.arange(0, 1 << 32, 9973, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([near, -near, spread])
    with np.errstate(all="ignore"):
        expected = values.astype(np.float16)
    nan = np.isnan(values)
    assert (to_float16(values)[~nan].view(np.uint16) == expected[~nan].view(np.uint16)).all()
    assert np.isnan(to_float16(values)[nan]).all() and nan.sum() > 1000
    logits = np.random.default_rng(0).normal(0, 4, (2, 8, 30, 30)).astype(np.float32)
    softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)  # as attention: many values below 2^-14
    assert (softmax < 2**-14).mean() > 0.2
    assert (to_float16(softmax).view(np.uint16) == softmax.astype(np.float16).view(np.uint16)).all()


def test_store_evicts_least_recently_used_beyond_count():
    store = memory_store(max_items=2)
    run = asyncio.run
    a, b = run(store.put(entry())), run(store.put(entry()))
    assert run(store.get(a)) is not None  # a is now the most recently used
    c = run(store.put(entry()))
    assert run(store.get(b)) is None and run(store.get(a)) is not None and run(store.get(c)) is not None
    assert store.storage.count("alignment") == 2


def test_store_bounds_bytes():
    one = len(entry().to_bytes())
    store = memory_store(max_bytes=3 * one)
    run = asyncio.run
    ids = [run(store.put(entry())) for _ in range(5)]
    assert store.storage.count("alignment") == 3 and store.storage.bytes["alignment"] == 3 * one
    assert [run(store.get(i)) is not None for i in ids] == [False, False, True, True, True]
    assert run(memory_store(max_bytes=one - 1).put(entry())) is None  # too big on its own: not stored
    assert run(store.get("../etc")) is None


def test_store_ttl():
    clock = Clock()
    store = memory_store(ttl_s=10, clock=clock)
    run = asyncio.run
    old = run(store.put(entry()))
    clock.now = 5
    young = run(store.put(entry()))
    clock.now = 11
    assert run(store.get(old)) is None and run(store.get(young)) is not None
    clock.now = 16
    assert run(store.get(young)) is None


def test_words_merge_pieces_and_keep_eos_alone():
    tokens = ["▁Hel", "lo", "▁wor", "ld", ".", "</s>"]
    assert words(tokens) == [[0, 1], [2, 3, 4], [5]]
    assert words(["lo", "▁a", "</s>"]) == [[0], [1], [2]]  # a first piece starts a word even without ▁


def test_word_attention_rows_still_sum_to_one():
    source = ["▁The", "▁qu", "ick", "▁fox", ".", "</s>"]
    target = ["▁Der", "▁schn", "elle", "▁Fuchs", "</s>"]
    att = attention(target=len(target), source=len(source))
    src_words, tgt_words, merged = to_words(source, target, att)
    assert src_words == ["The", "quick", "fox.", "</s>"] and tgt_words == ["Der", "schnelle", "Fuchs", "</s>"]
    assert merged.shape == (2, 3, 4, 4)
    assert_allclose(merged.sum(-1), np.ones((2, 3, 4)), rtol=1e-5)
    # "schnelle" = mean of its two rows; "quick" = sum of its two columns
    assert_allclose(merged[:, :, 1, 1], (att[:, :, 1, 1:3].sum(-1) + att[:, :, 2, 1:3].sum(-1)) / 2, rtol=1e-5)


def test_select_keeps_four_axes():
    att = attention()
    assert select(att, 0, None).shape == (2, 3, 4, 5)
    assert select(att, 0, 1).shape == (1, 3, 4, 5)
    assert_allclose(select(att, 1, "mean")[:, 0], att.mean(1))


def test_hard_alignment_skips_eos():
    att = np.zeros((1, 1, 3, 3), dtype=np.float32)
    att[0, 0, 0] = [0.1, 0.8, 0.1]  # target 0 -> source 1
    att[0, 0, 1] = [0.3, 0.1, 0.6]  # target 1 -> source 0 (source 2 is </s>)
    att[0, 0, 2] = [0.1, 0.1, 0.8]  # target </s>: no pair
    assert hard_alignment(["▁a", "▁b", "</s>"], ["▁x", "▁y", "</s>"], att) == "1-0 0-1"


def test_composing_two_legs_joins_them_word_by_word():
    """Source [a, </s>] -> pivot pieces [x, y (same word), z, </s>] -> the second model reads the
    pivot as [xy, z, </s>] (its own pieces) -> target [u, </s>]."""
    import numpy as np

    from app.alignments import Alignment, compose

    first = np.array([[0.9, 0.1], [0.7, 0.3], [0.2, 0.8], [0.5, 0.5]], dtype=np.float32)  # (T1=4, S=2)
    second = np.array([[0.6, 0.4, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32)  # (T2=2, P=3)
    a = Alignment("fr-en", ["\u2581a", "</s>"], ["\u2581x", "y", "\u2581z", "</s>"], first[None, None])
    b = Alignment("en-de", ["\u2581xy", "\u2581z", "</s>"], ["\u2581u", "</s>"], second[None, None])
    c = compose(a, b, "fr-de")
    # u: 0.6 x (mean of x, y) + 0.4 x z; </s>: the first leg's </s>
    expected = np.array([[0.6 * 0.8 + 0.4 * 0.2, 0.6 * 0.2 + 0.4 * 0.8], [0.5, 0.5]])
    assert c.model == "fr-de" and c.source_tokens == a.source_tokens and c.target_tokens == b.target_tokens
    assert np.allclose(c.attention[0, 0], expected)
    other = Alignment("en-de", ["\u2581x", "\u2581y", "\u2581z", "</s>"], ["\u2581u", "</s>"],
                      np.full((1, 1, 2, 4), 0.25, dtype=np.float32))
    assert compose(a, other, "fr-de") is None  # three pivot words against two: no composition
