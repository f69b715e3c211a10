"""Search strategies by name, and the one place that picks the search for a batch (`make_search`).

A strategy says how each sentence's hypotheses grow once the decoder has given a step's logits:

- "greedy": each sentence's best token, until EOS or its length cap. This is beam search of
  width 1 (of a sentence's two candidates only the best may end, and it ends the sentence), so it
  shares beam search's step and that step's C++ twin, and its hypotheses are Hugging Face
  `generate(num_beams=1)`'s (tests/test_marian_parity.py).
- "beam": beam_size hypotheses per sentence (model/search.py; `generate(num_beams=k,
  early_stopping=True)`'s semantics).

A strategy is carried out by an engine, chosen by what the Translator holds:

- "eager": `search.beam_search` over the IncrementalDecoder (the model, its fused int8 engine, a
  shortlisted decoder), its step after the decoder `search.select` (PyTorch) or `kernels.select`
  (C++; the two are twins: tests/test_kernels.py);
- "graphed": `graphs.GraphedBeamSearch`, each decoder and search step one replayed CUDA graph
  (on a GPU). Its step has no repetition penalty, so a batch that asks for one runs eagerly.

Passes over whole translations sit above the search, in model/pipeline.py, which the Translator
and the service both run: the annotated-term retry (`missed_terms`, `retry_options`) decodes the
texts again whose annotated terms no beam wrote, their terms as sentinels.

A new strategy (sampling: a step that draws its candidates from the distribution; prefix-
constrained search: a step that masks the logits outside the allowed prefix) is a select function
with `search.select`'s contract (and its C++ twin), an entry in STRATEGIES, and the option that
names it (model/options.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from model.graphs import GraphedBeamSearch
from model.options import DecodingOptions
from model.search import Hypothesis, IncrementalDecoder, SelectFn, beam_search

# the strategies, and the beam width each gives a sentence
STRATEGIES: dict[str, Callable[[DecodingOptions], int]] = {
    "greedy": lambda options: 1,
    "beam": lambda options: options.beam_size,
}


def strategy_of(options: DecodingOptions) -> str:
    """The strategy the options name: greedy for one beam, beam search for more."""
    return "greedy" if options.beam_size == 1 else "beam"


@dataclass(frozen=True)
class Search:
    """How one batch is decoded: the strategy, the engine, and the call that runs them."""

    strategy: str  # a key of STRATEGIES
    engine: str  # "eager" or "graphed"
    run: Callable[[Tensor, Tensor], list[list[Hypothesis]]]  # (src (B, S), caps (B,)) -> hypotheses per sentence


def make_search(options: DecodingOptions, decoder: IncrementalDecoder, select_fn: SelectFn,
                graphed: GraphedBeamSearch | None = None, columns: Tensor | None = None) -> Search:
    """The search for a batch decoded as `options` say (their length_penalty set): the strategy
    they name, on the graphed engine when there is one and it can take them, else eagerly over
    `decoder` with `select_fn` as the step after it; over the vocabulary's `columns` only when
    given (a shortlist: model/shortlist.py; the eager engine's)."""
    strategy = strategy_of(options)
    width = STRATEGIES[strategy](options)
    o = options
    if graphed is not None and o.repetition_penalty == 1.0:
        return Search(strategy, "graphed", lambda src, caps: graphed(
            src, width, o.n_best, o.length_penalty, caps, o.attention, o.min_length))
    if columns is not None:
        decoder = decoder.shortlisted(columns)
    return Search(strategy, "eager", lambda src, caps: beam_search(
        decoder, src, width, o.n_best, o.length_penalty, caps, o.attention, o.min_length, select_fn,
        o.repetition_penalty))
