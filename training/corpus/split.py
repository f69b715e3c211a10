"""Held-out sets: whole units chosen by a seeded hash, with per-source quotas."""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict

from model import protect
from training.corpus.common import HELDOUT_MAX_UNIT, HELDOUT_MAX_WORDS, HELDOUT_MIN_WORDS, SEED, norm_key, word_count
from training.corpus.ding import DING_SOURCES


def unit_hash(name: str, seed: str = SEED) -> str:
    return hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()


def heldout_ok(en: str) -> bool:
    """Pairs allowed in dev/test: English of 3..60 words, not starting mid-sentence."""
    return HELDOUT_MIN_WORDS <= word_count(en) <= HELDOUT_MAX_WORDS and not en[0].islower()


def split_by_unit(pairs: list[dict], quotas: dict[str, tuple[int, int]],
                  seed: str = SEED) -> tuple[list[dict], list[dict], list[dict]]:
    """Split pairs ({source, unit, en, de}) into train/dev/test by whole unit.

    ``quotas`` maps source -> (dev pairs, test pairs).  Units of a source are visited in
    seeded-hash order; a unit goes to dev until the dev quota is met, then to test.  Only
    heldout_ok pairs of a held-out unit are kept; units larger than HELDOUT_MAX_UNIT
    stay in train.  Train pairs whose normalised English occurs in dev/test are dropped.
    """
    units: dict[tuple[str, str], list[dict]] = OrderedDict()
    for p in pairs:
        units.setdefault((p["source"], p["unit"]), []).append(p)
    held: dict[tuple[str, str], str] = {}
    for src, (q_dev, q_test) in quotas.items():
        names = sorted((u for u in units if u[0] == src), key=lambda u: unit_hash(f"{u[0]}:{u[1]}", seed))
        n_dev = n_test = 0
        for u in names:
            good = sum(heldout_ok(p["en"]) for p in units[u])
            if good == 0 or good > HELDOUT_MAX_UNIT:
                continue
            if n_dev < q_dev:
                held[u], n_dev = "dev", n_dev + good
            elif n_test < q_test:
                held[u], n_test = "test", n_test + good
            else:
                break
    train, dev, test = [], [], []
    for u, ps in units.items():
        where = held.get(u)
        if where is None:
            train.extend(ps)
        else:
            (dev if where == "dev" else test).extend(p for p in ps if heldout_ok(p["en"]))
    return dedup_against(train, dev + test), dev, test


def dedup_against(train: list[dict], heldout: list[dict]) -> list[dict]:
    """Drop train pairs whose normalised English occurs in any held-out pair."""
    keys = {norm_key(p["en"]) for p in heldout}
    return [p for p in train if norm_key(p["en"]) not in keys]


def pick_general_test(pairs: list[dict], size: int, seed: str = SEED) -> list[dict]:
    """Choose ``size`` Ding example sentences (English >= 4 words) by seeded hash."""
    # "/" marks Ding's inline alternatives ("this / that"): not a clean reference
    cands = [p for p in pairs if p["source"] == "ding" and word_count(p["en"]) >= 4
             and "/" not in p["en"] + p["de"]]
    cands.sort(key=lambda p: unit_hash(p["unit"] + p["en"], seed))
    return cands[:size]


def drop_ding_lines(pairs: list[dict], general: list[dict]) -> tuple[list[dict], Counter]:
    """Remove test_general's pairs and every other Ding pair (``ding`` or ``ding_dict``) of the
    same dictionary line, so a held-out sentence's idiom is not taught by its siblings.
    Returns the remaining pairs and how many siblings each source lost."""
    held_ids = {id(p) for p in general}
    held_lines = {p["unit"] for p in general}
    rest, dropped = [], Counter()
    for p in pairs:
        if id(p) in held_ids:
            continue
        if p["source"] in DING_SOURCES and p["unit"] in held_lines:
            dropped[p["source"]] += 1
            continue
        rest.append(p)
    return rest, dropped


def protect_ok(en: str) -> bool:
    """Pairs for the placeholder/markup test: at least one protected span, 2..60 words."""
    return 2 <= word_count(en) <= HELDOUT_MAX_WORDS and bool(protect.find_spans(en))


def pick_protect_test(train: list[dict], size: int, seed: str = SEED) -> tuple[list[dict], list[dict]]:
    """Hold out whole ``catalogs`` units (seeded-hash order) until ``size`` of their pairs carry
    placeholders or markup; return (train without those units, the held-out protected pairs)."""
    units: dict[str, list[dict]] = OrderedDict()
    for p in train:
        if p["source"] == "catalogs":
            units.setdefault(p["unit"], []).append(p)
    held, test = set(), []
    for unit in sorted(units, key=lambda u: unit_hash(f"catalogs:{u}", seed)):
        if len(test) >= size:
            break
        good = [p for p in units[unit] if protect_ok(p["en"])]
        if good and len(units[unit]) <= HELDOUT_MAX_UNIT:
            held.add(unit)
            test += good
    rest = [p for p in train if not (p["source"] == "catalogs" and p["unit"] in held)]
    return dedup_against(rest, test), test
