"""Vocabulary shortlists: each batch's decoder steps compute the logits of the target pieces
likely for its sources only, the rest -inf (Jean et al., 2015; the lexical shortlists of Marian
and CTranslate2's vocabulary map work this way).

On the CPU the output projection is most of an int8 decoder step (at 200 rows, 2.9 of ~4.3 ms
for the shipped en-de model: 8,034 x 256 multiply-adds a row against ~1.8M for both decoder
layers). A batch's shortlist is the union of
- the `frequent` target pieces (function words, punctuation, EOS),
- for every piece of its sources, the `candidates` that co-occur with it most often in the
  training pairs (training/shortlist.py builds both), and
- the source pieces themselves when the vocabulary is joint (names, numbers, sentinels and
  inline glossary terms are copied).
Log-probabilities are then normalised over the shortlist. The file lives beside the weights as
shortlist.safetensors; a model without one decodes over its whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from model.config import SHORTLIST_FILE


class Shortlist:
    def __init__(self, candidates: Tensor, frequent: Tensor, copy_source: bool):
        """candidates (source vocabulary, k) int64: target ids per source id, -1 where there are
        fewer than k; frequent (F,) int64: target ids every batch gets; copy_source: whether the
        source ids themselves are target ids (a joint vocabulary)."""
        assert candidates.dim() == 2 and frequent.dim() == 1
        self.candidates, self.frequent, self.copy_source = candidates.long(), frequent.long(), copy_source
        # the largest target id the tables hold (-1: none), for the size of columns()' mask
        self.largest = max([int(t.max()) for t in (self.candidates, self.frequent) if t.numel()], default=-1)

    @classmethod
    def load(cls, directory: Path, copy_source: bool) -> Shortlist | None:
        path = Path(directory) / SHORTLIST_FILE
        if not path.exists():
            return None
        tensors = load_file(str(path))
        return cls(tensors["candidates"], tensors["frequent"], copy_source)

    def save(self, directory: Path) -> None:
        save_file({"candidates": self.candidates.int().contiguous(), "frequent": self.frequent.int().contiguous()},
                  str(Path(directory) / SHORTLIST_FILE))

    def columns(self, sources: list[list[int]], always: Iterable[int] = ()) -> Tensor:
        """The sorted target ids a batch of sources may write: (V',) int64."""
        always = list(always)
        largest = max([self.largest, *always] + [max(s, default=-1) for s in sources])
        chosen = torch.zeros(largest + 1, dtype=torch.bool)
        self.mark(sources, chosen, always)
        return chosen.nonzero()[:, 0]

    def mark(self, sources: list[list[int]], chosen: Tensor, always: Iterable[int] = ()) -> None:
        """Set chosen[id] (a bool mask over the target vocabulary) for every id `columns` gives
        these sources: a running batch adds its joiners' to those of the sentences running."""
        ids = torch.tensor(sorted({i for s in sources for i in s}), dtype=torch.long)
        ids = ids[ids < self.candidates.size(0)]
        candidates = self.candidates[ids].flatten()
        chosen[self.frequent] = True
        chosen[candidates[candidates >= 0]] = True
        chosen[torch.tensor(list(always), dtype=torch.long)] = True
        if self.copy_source:
            chosen[ids[ids < chosen.numel()]] = True
