"""Stored cross-attention of translations, and the views GET /v1/alignments/{id} offers of it.

An alignment lives in the service's storage (app/storage.py) under "alignment:<id>" for
NMT_ALIGNMENT_TTL_S: a JSON header line (model, tokens, shape) and the attention as float16
bytes (half of float32, 3 significant digits: what the viewer draws), so a replica finds what
another stored. In this process the store keeps at most NMT_ALIGNMENT_MAX_ITEMS of them within
NMT_ALIGNMENT_MAX_BYTES, the least recently used going first.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

import numpy as np

from app.storage import Storage, charge_quota

EOS = "</s>"
WORD_START = "\u2581"  # SentencePiece's "▁": the piece begins a word


def to_float16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to float16 ("<f2": to nearest, ties to even), bit for bit numpy's
    cast (NaN aside: any NaN becomes float16's quiet NaN) in integer steps over the values' bits.
    numpy's cast goes one value at a time, and a value below float16's normal range (2^-14) costs
    it ~20x more (it sets the underflow flag): softmax attention has many, and the cast took ~0.7 ms
    of the server's CPU for each alignment it stored."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    # normal range: the exponent's bias 127 -> 15, and the 13 mantissa bits dropped rounded to
    # nearest, ties to even (+0xFFF, +1 when the lowest bit kept is odd)
    half = (magnitude >> 13) & np.uint32(1)
    half += magnitude
    half -= np.uint32(((127 - 15) << 23) - 0xFFF)
    half >>= 13
    # below it float16 counts in steps of 2^-24: adding 0.5 (whose float32 step is 2^-24) rounds the
    # value to those steps, and the low bits of the sum are their number
    with np.errstate(invalid="ignore"):  # a signalling NaN's sum (replaced below)
        steps = (magnitude.view(np.float32) + np.float32(0.5)).view(np.uint32)
    steps -= np.uint32(0x3F000000)  # 0.5's bits
    np.copyto(half, steps, where=magnitude < np.uint32(113 << 23))  # 2^-14
    np.copyto(half, np.uint32(0x7C00), where=magnitude >= np.uint32(143 << 23))  # 2^16 and past: infinity
    np.copyto(half, np.uint32(0x7E00), where=magnitude > np.uint32(0x7F800000))  # NaN
    half |= (bits >> 16) & np.uint32(0x8000)  # the sign
    return half.astype("<u2").view("<f2")


@dataclass
class Alignment:
    model: str
    source_tokens: list[str]  # columns, EOS included
    target_tokens: list[str]  # rows, EOS included when the hypothesis ended with it
    attention: np.ndarray  # (layers, heads, target, source), rows sum to 1

    def to_bytes(self) -> bytes:
        header = {"model": self.model, "source_tokens": self.source_tokens, "target_tokens": self.target_tokens,
                  "shape": list(self.attention.shape)}
        return json.dumps(header).encode() + b"\n" + to_float16(self.attention).tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> Alignment:
        header, _, array = data.partition(b"\n")
        fields = json.loads(header)
        attention = np.frombuffer(array, dtype="<f2").astype(np.float32).reshape(fields["shape"])
        return cls(fields["model"], fields["source_tokens"], fields["target_tokens"], attention)


class AlignmentStore:
    def __init__(self, storage: Storage, ttl_s: float, max_bytes: int, client_bytes: int = 0):
        self.storage, self.ttl_s, self.max_bytes, self.client_bytes = storage, ttl_s, max_bytes, client_bytes

    async def put(self, alignment: Alignment, owner: str = "") -> str | None:
        """Store it and return its id; None when it alone exceeds the byte bound (or the store is
        off); QuotaExceeded past the owner's share (NMT_CLIENT_ALIGNMENT_BYTES)."""
        data = alignment.to_bytes()
        if len(data) > self.max_bytes:
            return None
        await charge_quota(self.storage, "alignments", owner, len(data), self.client_bytes, self.ttl_s,
                           "NMT_CLIENT_ALIGNMENT_BYTES")
        key = secrets.token_hex(16)
        return key if await self.storage.put(f"alignment:{key}", data, self.ttl_s) else None

    async def get(self, key: str) -> Alignment | None:
        if not key.isalnum():
            return None
        data = await self.storage.get(f"alignment:{key}")
        return None if data is None else Alignment.from_bytes(data)


def select(attention: np.ndarray, axis: int, choice: int | str | None) -> np.ndarray:
    """Keep every index (None), one index, or the mean ("mean"), as a size-1 axis."""
    if choice is None:
        return attention
    if choice == "mean":
        return attention.mean(axis=axis, keepdims=True)
    return np.take(attention, [int(choice)], axis=axis)


def words(tokens: list[str]) -> list[list[int]]:
    """Group piece indices into words: a word starts at a piece beginning with "▁"; EOS stands alone."""
    groups: list[list[int]] = []
    for i, token in enumerate(tokens):
        if token == EOS or not groups or token.startswith(WORD_START) or tokens[i - 1] == EOS:
            groups.append([i])
        else:
            groups[-1].append(i)
    return groups


def word_text(tokens: list[str], group: list[int]) -> str:
    text = "".join(tokens[i] for i in group)
    return text if text == EOS else text.replace(WORD_START, " ").strip() or WORD_START


def to_words(source_tokens: list[str], target_tokens: list[str], attention: np.ndarray):
    """Word-level attention: sum over a word's source pieces (a row stays a distribution), average
    over a word's target pieces (a mean of distributions is one). Returns (source words, target
    words, attention (..., target words, source words))."""
    src_groups, tgt_groups = words(source_tokens), words(target_tokens)
    src_merge = np.zeros((len(source_tokens), len(src_groups)), dtype=np.float32)  # (S, Sw) 0/1
    for w, group in enumerate(src_groups):
        src_merge[group, w] = 1.0
    tgt_merge = np.zeros((len(tgt_groups), len(target_tokens)), dtype=np.float32)  # (Tw, T) 1/|word|
    for w, group in enumerate(tgt_groups):
        tgt_merge[w, group] = 1.0 / len(group)
    merged = tgt_merge @ attention @ src_merge
    return ([word_text(source_tokens, g) for g in src_groups], [word_text(target_tokens, g) for g in tgt_groups],
            merged)


def compose(first: Alignment, second: Alignment, model: str) -> Alignment | None:
    """Source -> target attention through a pivot language: the second leg's attention over the
    pivot text times the first leg's, each the mean over its layers and heads. The two models cut
    the pivot text into their own pieces, so the legs meet word by word: a piece of the second
    leg's source stands for the pieces of the same word in the first leg's output (its EOS for the
    first leg's EOS, or for the whole output when that has none). Returns one layer and one head,
    rows summing to 1; None when the two do not see the same number of words."""
    out_words = [g for g in words(first.target_tokens) if first.target_tokens[g[0]] != EOS]  # (pivot words)
    in_words = [g for g in words(second.source_tokens) if second.source_tokens[g[0]] != EOS]
    if len(out_words) != len(in_words):
        return None
    T1 = len(first.target_tokens)
    bridge = np.zeros((len(second.source_tokens), T1), dtype=np.float32)  # (P, T1), rows sum to 1
    for pieces_in, pieces_out in zip(in_words, out_words):
        bridge[np.ix_(pieces_in, pieces_out)] = 1.0 / len(pieces_out)
    first_eos = [i for i, t in enumerate(first.target_tokens) if t == EOS]
    for j, token in enumerate(second.source_tokens):
        if token == EOS:
            bridge[j, first_eos or list(range(T1))] = 1.0 / (len(first_eos) or T1)
    composed = second.attention.mean(axis=(0, 1)) @ bridge @ first.attention.mean(axis=(0, 1))  # (T2, S)
    return Alignment(model, first.source_tokens, second.target_tokens, composed[None, None])


def hard_alignment(source_tokens: list[str], target_tokens: list[str], attention: np.ndarray) -> str:
    """Pharaoh "i-j" pairs (source i, target j): each target token's most attended source token,
    from the mean over the given layers and heads; EOS rows and columns take no part."""
    matrix = attention.mean(axis=(0, 1))  # (T, S)
    columns = [j for j, t in enumerate(source_tokens) if t != EOS]
    if not columns:
        return ""
    best = matrix[:, columns].argmax(axis=1).tolist()
    return " ".join(f"{columns[best[t]]}-{t}" for t, token in enumerate(target_tokens) if token != EOS)


def rounded_array(attention) -> np.ndarray:
    """Attention as the API writes it: 6 decimals (a third of the JSON, the same picture), float32,
    which orjson prints in its shortest form (app/routers: `json_response`)."""
    return np.round(np.asarray(attention, dtype=np.float32), 6)
