"""Stored cross-attention of translations, and the views GET /v1/alignments/{id} offers of it.

The store is an LRU bounded by entry count and by the bytes of the stored arrays, with a TTL; it
is touched from the event loop (put) and from the threadpool (get), hence the lock.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

EOS = "</s>"
WORD_START = "\u2581"  # SentencePiece's "▁": the piece begins a word


@dataclass
class Alignment:
    model: str
    source_tokens: list[str]  # columns, EOS included
    target_tokens: list[str]  # rows, EOS included when the hypothesis ended with it
    attention: np.ndarray  # (layers, heads, target, source), float32, rows sum to 1
    expires: float = 0.0

    @property
    def nbytes(self) -> int:
        return self.attention.nbytes


class AlignmentStore:
    def __init__(self, max_items: int, max_bytes: int, ttl_s: float, clock=time.monotonic):
        self.max_items, self.max_bytes, self.ttl_s, self.clock = max_items, max_bytes, ttl_s, clock
        self._entries: OrderedDict[str, Alignment] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, alignment: Alignment) -> str | None:
        """Store it and return its id; None when it alone exceeds the byte bound (or the store is off)."""
        if alignment.nbytes > self.max_bytes or self.max_items == 0:
            return None
        key = uuid.uuid4().hex
        with self._lock:
            alignment.expires = self.clock() + self.ttl_s
            self._entries[key] = alignment
            self.bytes += alignment.nbytes
            self._expire()
            while len(self._entries) > self.max_items or self.bytes > self.max_bytes:
                self._pop_oldest()
        return key

    def get(self, key: str) -> Alignment | None:
        with self._lock:
            alignment = self._entries.get(key)
            if alignment is None:
                return None
            if alignment.expires <= self.clock():
                self.bytes -= self._entries.pop(key).nbytes
                return None
            self._entries.move_to_end(key)
            return alignment

    def _expire(self) -> None:
        # Least recently used first is not quite expiry order (a lookup moves an entry back but
        # keeps its expiry), so an expired entry can outlive this sweep; get() checks its own.
        now = self.clock()
        while self._entries and next(iter(self._entries.values())).expires <= now:
            self._pop_oldest()

    def _pop_oldest(self) -> None:
        _, alignment = self._entries.popitem(last=False)
        self.bytes -= alignment.nbytes


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


def hard_alignment(source_tokens: list[str], target_tokens: list[str], attention: np.ndarray) -> str:
    """Pharaoh "i-j" pairs (source i, target j): each target token's most attended source token,
    from the mean over the given layers and heads; EOS rows and columns take no part."""
    matrix = attention.mean(axis=(0, 1))  # (T, S)
    columns = [j for j, t in enumerate(source_tokens) if t != EOS]
    if not columns:
        return ""
    best = matrix[:, columns].argmax(axis=1).tolist()
    return " ".join(f"{columns[best[t]]}-{t}" for t, token in enumerate(target_tokens) if token != EOS)


def rounded(attention) -> list:
    # 6 decimals (in float64, so they print short): a third of the JSON, the same picture
    return np.round(np.asarray(attention, dtype=np.float64), 6).tolist()
