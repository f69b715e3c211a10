"""What a translation returns (`TranslationResult`, one per source, its `Translation`s best first),
and `restore`, which puts protected spans back into them (model/protect.py). No torch here: the
service's HTTP process reads these without it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from model import protect


@dataclass
class Translation:
    text: str
    tokens: list[str]  # target pieces, without EOS
    token_ids: list[int]
    score: float  # log-prob / length^length_penalty
    log_prob: float
    ended_with_eos: bool  # False when the length cap stopped it
    # (layers, heads, target_len, source_len) incl. the EOS step: a float32 torch Tensor from the
    # Translator, a numpy array once it has crossed the service's worker socket
    attention: Any = None
    target_tokens: list[str] | None = None  # the attention's rows: tokens (+ "</s>" when it ended with EOS)
    # protected spans (placeholders, tags, URLs, ...; model/protect.py), by number: those the output
    # lacked, put back where the attention points, and repeated or unknown ones that were removed
    spans_inserted: list[int] = field(default_factory=list)
    spans_removed: list[int] = field(default_factory=list)

    @property
    def repaired(self) -> bool:
        return bool(self.spans_inserted or self.spans_removed)


@dataclass
class TranslationResult:
    source_tokens: list[str]  # the attention's columns, EOS included (a span's sentinel shows its text)
    hypotheses: list[Translation] = field(default_factory=list)  # best first
    spans: list[str] = field(default_factory=list)  # the protected spans of the source, in order
    # with terminology (model/terms.py): the entries applied, not applied, not found in the source
    terms: dict[str, list[str]] | None = None


def restore(result: TranslationResult, spans: list[str], source: str | None = None) -> TranslationResult:
    """Put the protected spans back into a result's texts and tokens (in place): sentinel k
    becomes spans[k]; with the masked `source`, a span glued to a word there is glued in the
    texts too (protect.keep_glue)."""
    result.spans = spans
    result.source_tokens = show_spans(result.source_tokens, spans)
    for h in result.hypotheses:
        h.text = protect.unmask(protect.keep_glue(h.text, source) if source else h.text, spans)
        h.tokens = show_spans(h.tokens, spans)
        if h.target_tokens is not None:
            h.target_tokens = show_spans(h.target_tokens, spans)
    return result


def show_spans(pieces: list[str], spans: list[str]) -> list[str]:
    """Pieces as a reader should see them: a sentinel piece shows the span it stands for."""
    out = []
    for p in pieces:
        k = protect.sentinel_index(p)
        out.append(p if k is None or k >= len(spans) else p.replace(protect.sentinel(k), spans[k]))
    return out


def terms_first(hypotheses: list[Translation], lacks_terms: Callable[[str], bool]) -> list[Translation]:
    """The hypotheses whose text writes the terms it must (not `lacks_terms`) first, each group
    in its order (best first)."""
    return sorted(hypotheses, key=lambda h: lacks_terms(h.text))
