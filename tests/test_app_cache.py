"""The translation cache (app/cache.py) in one process: the same text, model and options are
decoded once; other options, attention and alignments are never served from it; NMT_CACHE=false
turns it off."""

from __future__ import annotations

import re

import pytest

from app.settings import Settings
from tests.conftest import ready_client


@pytest.fixture(scope="module")
def client(tiny_checkpoint):
    with ready_client(Settings(model_dirs=[str(tiny_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                               dtype="float32")) as c:
        yield c


def counts(client) -> dict[str, float]:
    text = client.get("/metrics").text
    found = dict(re.findall(r'nmt_cache_lookups_total\{result="(\w+)"\} (\S+)', text))
    items = re.search(r'nmt_translated_items_total\{model="en-de"\} (\S+)', text)
    return {"hit": float(found.get("hit", 0)), "miss": float(found.get("miss", 0)),
            "decoded": float(items.group(1)) if items else 0.0}


def translate(client, **options):
    body = {"text": "Open the file and save it.", "source": "en", "target": "de", "max_length": 8, **options}
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 200, r.text
    return r.json()["translations"][0]


def test_same_text_and_options_are_decoded_once(client):
    before = counts(client)
    first = translate(client)
    second = translate(client)
    after = counts(client)
    assert second["text"] == first["text"] and second["score"] == first["score"]
    assert after["hit"] == before["hit"] + 1 and after["decoded"] == before["decoded"] + 1
    # LibreTranslate's route caches sentence by sentence: a catalog's repeated strings
    lt = {"q": "Save the file. Open the file and save it.", "source": "en", "target": "de"}
    client.post("/translate", json=lt)
    middle = counts(client)
    client.post("/translate", json=lt)
    assert counts(client)["hit"] == middle["hit"] + 2 and counts(client)["decoded"] == middle["decoded"]


def test_other_options_attention_and_alignments_are_never_served_from_it(client):
    translate(client)
    before = counts(client)
    for options in ({"beam_size": 2}, {"max_length": 9}, {"length_penalty": 0.5}, {"n_best": 2}):
        translate(client, **options)
    after = counts(client)
    assert after["hit"] == before["hit"] and after["decoded"] == before["decoded"] + 4
    with_attention = translate(client, include_attention=True)
    assert with_attention["attention"] and counts(client)["decoded"] == after["decoded"] + 1
    stored = translate(client, alignments=True)
    assert stored["alignment_id"] and counts(client)["decoded"] == after["decoded"] + 2
    assert counts(client)["hit"] == after["hit"]


def test_opt_out(tiny_checkpoint):
    with ready_client(Settings(model_dirs=[str(tiny_checkpoint)], workers=1, threads_per_worker=1, cache=False)) as c:
        translate(c)
        translate(c)
        assert counts(c) == {"hit": 0.0, "miss": 0.0, "decoded": 2.0}


def test_api_keys_do_not_share_cached_translations(tiny_checkpoint):
    """NMT_CACHE_SCOPE=key: a key is never served what another key had translated (how fast it
    came back would tell it so); the same key is."""
    settings = Settings(model_dirs=[str(tiny_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        dtype="float32", api_keys=["key-a", "key-b"])
    with ready_client(settings) as c:
        body = {"text": "Close the window now.", "source": "en", "target": "de", "max_length": 8}
        c.post("/v1/translate", json=body, headers={"x-api-key": "key-a"})
        before = counts(c)
        c.post("/v1/translate", json=body, headers={"x-api-key": "key-b"})
        middle = counts(c)
        c.post("/v1/translate", json=body, headers={"x-api-key": "key-b"})
        after = counts(c)
    assert middle["hit"] == before["hit"] and middle["decoded"] == before["decoded"] + 1  # key-b: not key-a's
    assert after["hit"] == middle["hit"] + 1  # its own


def test_every_decoding_option_changes_the_cache_key():
    """The key hashes the whole BatchKey: no option can be forgotten there (the model and each
    decoding option, changed alone, give another key; so do the compute type, the source, the
    partition and whether the hypotheses hold attention weights)."""
    from dataclasses import fields

    from app.cache import TranslationCache
    from app.scheduler import BatchKey
    from app.storage import MemoryStorage
    from model.options import DecodingOptions

    cache = TranslationCache(MemoryStorage(), 60.0, {"en-de": "weights-a", "de-en": "weights-b"})
    base = BatchKey("en-de", DecodingOptions(beam_size=4, n_best=1, length_penalty=1.0))
    other = {"beam_size": 5, "n_best": 2, "length_penalty": 1.2, "max_length": 9, "min_length": 3, "attention": True,
             "repetition_penalty": 1.3}
    assert {f.name for f in fields(DecodingOptions)} == set(other), "a new decoding option needs a value here"
    assert {f.name for f in fields(BatchKey)} == {"model", "options"}
    keys = {cache.key(base, "int8", [5, 6, 3]), cache.key(BatchKey("de-en", base.options), "int8", [5, 6, 3])}
    for name, value in other.items():
        keys.add(cache.key(base.decoded(**{name: value}), "int8", [5, 6, 3]))
    keys |= {cache.key(base, "float32", [5, 6, 3]), cache.key(base, "int8", [5, 7, 3]),
             cache.key(base, "int8", [5, 6, 3], "key:abc"), cache.key(base, "int8", [5, 6, 3], weights=True)}
    assert len(keys) == 2 + len(other) + 4


def test_cached_hypotheses_come_back_exactly():
    """What the cache stores is what the pipeline's second half reads: ids, scores and the
    attention weights, bit for bit."""
    import numpy as np

    from app.cache import from_bytes, to_bytes
    from model.pipeline import Decoded

    weights = np.random.default_rng(0).random((4, 6), dtype=np.float32)
    hyps = [Decoded([5, 9, 2], -0.123456789, -1.5, True, weights), Decoded([7], float("-inf"), -9.0, False)]
    back = from_bytes(to_bytes(hyps))
    assert [(h.token_ids, h.score, h.log_prob, h.ended_with_eos) for h in back] == \
        [(h.token_ids, h.score, h.log_prob, h.ended_with_eos) for h in hyps]
    assert back[0].weights.dtype == np.float32 and np.array_equal(back[0].weights, weights)
    assert back[1].weights is None and back[0].attention is None
