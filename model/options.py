"""How to decode: one object from the HTTP request to the search, one name per option.

The service builds it from a request (app/routers), batches by it (app/scheduler.py's BatchKey,
whose every field the translation cache hashes), the worker hands it to `Translator.decode_all`,
and `model/strategies.py` picks the search that decodes it in one place (`make_search`).
A new option is a field here, its use in the search, and the HTTP field that sets it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from model.config import MAX_BEAM

MAX_REPETITION_PENALTY = 10.0
# without a max_length, a translation gets at most MAX_LENGTH_A * source length + MAX_LENGTH_B new
# tokens (EOS included), never more than MAX_LENGTH_CAP
MAX_LENGTH_A, MAX_LENGTH_B, MAX_LENGTH_CAP = 1.5, 10, 256


def length_cap(source_len: int, max_length: int | None, max_positions: int, a: float = MAX_LENGTH_A,
               b: int = MAX_LENGTH_B, cap: int = MAX_LENGTH_CAP) -> int:
    """New target tokens a source of `source_len` tokens may get, EOS included: max_length when
    given, else a * source_len + b within `cap`; never more than the model's positions."""
    if max_length:
        return max(1, min(max_length, max_positions))
    return max(1, min(cap, max_positions, math.ceil(a * source_len + b)))


@dataclass(frozen=True)
class DecodingOptions:
    beam_size: int = 4  # hypotheses kept each step; 1 is greedy search
    n_best: int = 1  # hypotheses returned per text, best first (at most beam_size)
    # hypotheses rank by log-prob / length^length_penalty; None: the model's own (its metadata)
    length_penalty: float | None = None
    # most new target tokens, EOS included; None: a * source length + b, capped (`length_cap`)
    max_length: int | None = None
    min_length: int = 0  # EOS is not allowed before this many new tokens
    # a token the hypothesis already wrote has its logit divided by this (multiplied when negative): CTRL's
    # repetition penalty (Keskar et al., 2019); 1 is none
    repetition_penalty: float = 1.0
    attention: bool = False  # return each hypothesis's encoder-decoder attention (layers, heads, target, source)

    def __post_init__(self):
        if not 1 <= self.beam_size <= MAX_BEAM:
            raise ValueError(f"beam_size must be between 1 and {MAX_BEAM}, got {self.beam_size}")
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError(f"n_best must be between 1 and beam_size={self.beam_size}, got {self.n_best}")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length must be at least 1, got {self.max_length}")
        if self.min_length < 0:
            raise ValueError(f"min_length must be at least 0, got {self.min_length}")
        if not 1.0 <= self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ValueError(f"repetition_penalty must be between 1 and {MAX_REPETITION_PENALTY:g}, "
                             f"got {self.repetition_penalty}")
