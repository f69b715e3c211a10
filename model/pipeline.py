"""The text pipeline around the search, in two halves; no torch here.

    plans = prepare(reader, texts, terms)          # what the model reads, and what finish needs
    hypotheses = <the search, on plan.ids>           # a worker process, or the Translator itself
    results = [finish(reader, plan, h, options) for plan, h in zip(plans, hypotheses)]

`prepare` cleans each text (model/clean.py), masks its protected spans and terms as sentinels
(model/protect.py, model/terms.py; for a model without sentinel pieces, takes them out), takes out
its accelerator mark (model/accelerators.py) and reads a text written in capitals in sentence
case (model/casing.py). `finish` turns a plan's hypotheses into its TranslationResult
(model/results.py): each holds the source's sentinels once (protect.repair), the mark and any
taken-out spans go back where the attention points, capitals come back, spans are put back, and
the terms report says which terms were applied. Between the two only ids and `Decoded`
hypotheses travel, so the search can run in another process.

A model that reads glossary terms inline (term_method "auto") gets every beam back; `finish`
puts first those that write the annotated terms, and `missed_terms` lists the plans whose best
translation still lacks one: the caller translates those again with the terms as sentinels.

The library's Translator (model/translator.py) and the service (app/service.py) both call these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from model import accelerators, casing, protect
from model.clean import clean_text, lone_surrogate
from model.options import DecodingOptions
from model.results import Translation, TranslationResult, restore, terms_first
from model.terms import Terminology, report, retry_beam_size, strip_tags
from model.tokenizer import Tokenizer

TERM_METHODS = ("auto", "annotate", "spans")


class SourceTooLong(ValueError):
    """A source with more tokens than the model reads (never truncated)."""

    def __init__(self, name: str, tokens: int, limit: int):
        super().__init__(f"{name} has {tokens} tokens (end of sentence included); allowed: 1 to {limit}")
        self.name, self.tokens, self.limit = name, tokens, limit


@dataclass(frozen=True)
class Reader:
    """What the pipeline needs to know of a model."""

    tokenizer: Tokenizer
    source_lang: str | None  # a text in capitals is read in this language's sentence case
    reads_annotations: bool  # trained to read glossary terms inline (training/annotate.py)
    max_source_tokens: int  # the longest source it reads, EOS included

    def has_sentinel(self, ids: list[int]) -> bool:
        return self.tokenizer.has_sentinels and not self.tokenizer.sentinel_ids.isdisjoint(ids)


@dataclass
class Decoded:
    """One hypothesis as the search found it, without torch: what crosses a worker's pipe."""

    token_ids: list[int]  # target ids, without the decoder start token and without EOS
    score: float  # log_prob / length^length_penalty
    log_prob: float
    ended_with_eos: bool  # False when the length cap stopped it
    weights: np.ndarray | None = None  # (T, S) cross-attention, mean over layers and heads (T incl. EOS)
    attention: np.ndarray | None = None  # (L, H, T, S) float32, when the options ask for attention


@dataclass
class Plan:
    """One source on its way through the pipeline: what the model reads (`ids`), and what
    `finish` needs to turn the hypotheses into its result (`prepare` makes it)."""

    source: str | list[int]  # as given
    ids: list[int]  # what the model reads
    masked: protect.Masked | None = None  # a text's protected spans and terms (None: ids were given)
    stripped: protect.Stripped | None = None  # spans taken out, for a model without sentinel pieces
    mark: accelerators.Marked | None = None  # the accelerator mark taken out
    shouting: bool = False  # written in capitals: read in sentence case, written back in capitals
    terms: Terminology | None = None  # its glossary and do-not-translate terms (None: no report)
    # with annotated glossary terms chosen among the beams: whether a translation lacks one
    missed: Callable[[str], bool] | None = None

    def needs_attention(self, reader: Reader) -> bool:
        """Whether the search must return attention weights for it: a repair places a missing
        span, and an accelerator mark or a taken-out span is placed, by the attention."""
        return reader.has_sentinel(self.ids) or bool(self.mark) or bool(self.stripped)


def mask(reader: Reader, text: str, terms: Terminology | None = None, annotate: bool = False) -> protect.Masked:
    """The text as the model reads it: control characters removed (model/clean.py) and, with
    sentinels in the vocabulary, protected spans masked (and `terms`' glossary and
    do-not-translate terms; with `annotate`, glossary terms inline). ValueError for a lone
    surrogate."""
    at = lone_surrogate(text)
    if at is not None:
        raise ValueError(f"a lone surrogate (U+{ord(text[at]):04X}) at character {at} is not valid Unicode")
    text = clean_text(text)
    tok = reader.tokenizer
    if not tok.has_sentinels:
        return protect.Masked(text)
    return protect.mask(text, foreign=tok.cannot_spell, terms=terms, annotate_glossary=annotate)


def prepare(reader: Reader, sources: list[str] | list[list[int]],
            terms: Terminology | list[Terminology | None] | None = None, term_method: str = "auto",
            names: list[str] | None = None) -> list[Plan]:
    """The first half: each source (a text, or EOS-terminated ids) as the model reads it, and its
    plan. A text: cleaned, protected spans masked (or taken out, for a model without sentinel
    pieces), glossary terms as spans or inline (term_method: "spans", "annotate", or "auto":
    inline for a model that reads them, its beams chosen by whether they write the terms).
    Then, for a text or ids, without its accelerator mark and in sentence case when written in
    capitals. SourceTooLong for a source outside the model's length (`names[i]` names source i)."""
    if term_method not in TERM_METHODS:
        raise ValueError(f"term_method must be auto, annotate or spans, got {term_method!r}")
    each_terms = terms if isinstance(terms, list) else [terms] * len(sources)
    if len(each_terms) != len(sources):
        raise ValueError(f"{len(each_terms)} terminologies for {len(sources)} sources")
    plans = []
    for i, (source, own) in enumerate(zip(sources, each_terms)):
        if not isinstance(source, str):
            plans.append(read(reader, Plan(source, list(source)), names[i] if names else f"source {i}"))
            continue
        annotated = bool(own and own.glossary) and reader.reads_annotations and term_method != "spans"
        masked = mask(reader, source, own, annotated)
        stripped = None
        if not reader.tokenizer.has_sentinels:
            # a model without sentinel pieces reads text without its spans; they go back by the
            # attention (not foreign words: spelt as they are)
            found = protect.take_out(masked.text, terms=own)
            if found.spans:
                stripped, masked = found, protect.Masked(found.text)
        missed = partial(lacks_terms, masked) if annotated and term_method == "auto" else None
        plan = Plan(source, [], masked, stripped, terms=own, missed=missed)
        plans.append(read(reader, plan, names[i] if names else f"source {i}"))
    return plans


def prepare_sentence(reader: Reader, sentence: str, name: str, terms: Terminology | None = None,
                     missed: Callable[[str], bool] | None = None) -> Plan:
    """The first half for a sentence of a document (app/markup.py): masked already where the
    model has sentinels (the document numbers its spans and puts them back, so the result keeps
    its sentinels); for a model without, its spans and `terms` taken out here, to go back by the
    attention. Its terms are reported for the whole document, not here."""
    plan = Plan(sentence, [], protect.Masked(sentence), missed=missed)
    if not reader.tokenizer.has_sentinels:
        found = protect.take_out(sentence, terms=terms)
        if found.spans:
            plan.stripped, plan.masked = found, protect.Masked(found.text)
    return read(reader, plan, name)


def read(reader: Reader, plan: Plan, name: str) -> Plan:
    """A plan's ids: its text without the accelerator mark, in sentence case when in capitals."""
    tok = reader.tokenizer
    text = plan.masked.text if plan.masked else tok.decode_source(plan.source)
    plan.mark = accelerators.find(text) if plan.stripped is None else None
    readable = plan.mark.text if plan.mark else text
    plan.shouting = casing.is_shouting(readable)
    if plan.shouting:
        readable = casing.sentence_case(readable, reader.source_lang,
                                        pieces=lambda word: len(tok.source_sp.encode(word)))
    ids = tok.encode_source(text) if plan.masked else list(plan.source)
    if not 1 <= len(ids) <= reader.max_source_tokens:
        raise SourceTooLong(name, len(ids), reader.max_source_tokens)
    if readable != text:
        read_ids = tok.encode_source(readable)
        if len(read_ids) <= reader.max_source_tokens:
            ids = read_ids
        else:  # as written, then
            plan.mark, plan.shouting = None, False
    plan.ids = ids
    return plan


def decoding(plans: list[Plan], options: DecodingOptions) -> DecodingOptions:
    """The options the search runs with for these plans: every beam back when a plan chooses
    among them by its annotated terms (the beams cost the same; finish keeps n_best)."""
    return replace(options, n_best=options.beam_size) if any(p.missed for p in plans) else options


def finish(reader: Reader, plan: Plan, hyps: list[Decoded], options: DecodingOptions) -> TranslationResult:
    """The second half: a plan's hypotheses (best first) as its result, options.n_best of them;
    those that write its annotated terms first; and which of its terms were applied."""
    how = (options.attention, plan.masked, plan.shouting, plan.mark, plan.stripped)
    result = to_result(reader, plan.ids, hyps[: options.n_best], *how)
    # the other beams, where the best lacks a term or alternatives are asked for
    if plan.missed and (options.n_best > 1 or plan.missed(result.hypotheses[0].text)):
        result = to_result(reader, plan.ids, hyps, *how)
        result.hypotheses = terms_first(result.hypotheses, plan.missed)[: options.n_best]
    if plan.terms and isinstance(plan.source, str):  # the repair (or the placement) puts every sentinel term in
        found = {m.entry for m in plan.terms.find(clean_text(plan.source))}
        used = (set(plan.stripped.terms.values()) if plan.stripped
                else plan.masked.terms_used(result.hypotheses[0].text))
        result.terms = report(plan.terms, found, used)
    return result


def missed_terms(plans: list[Plan], results: list[TranslationResult]) -> list[int]:
    """The plans whose best translation lacks an annotated term: to translate again with the
    terms as sentinels (which the repair cannot lose) and `retry_options`."""
    return [i for i, (p, r) in enumerate(zip(plans, results)) if p.missed and p.missed(r.hypotheses[0].text)]


def retry_options(options: DecodingOptions) -> DecodingOptions:
    return replace(options, beam_size=retry_beam_size(options.beam_size, options.n_best))


def to_result(reader: Reader, source_ids: list[int], hyps: list[Decoded], with_attention: bool,
              masked: protect.Masked | None = None, shouting: bool = False,
              marked: accelerators.Marked | None = None, stripped: protect.Stripped | None = None,
              ) -> TranslationResult:
    """Hypotheses as text; each holds the source's sentinels once (protect.repair), gets the
    source's accelerator mark back (`marked`), is written in capitals when the source was
    (`shouting`; its spans keep their case), and with `masked` has its spans put back;
    `stripped` (a model without sentinels): the spans taken out of the source go back where the
    attention points (protect.place)."""
    tok = reader.tokenizer
    source_pieces = tok.source_pieces(source_ids)
    result = TranslationResult(source_tokens=source_pieces)
    source_sentinels = reader.has_sentinel(source_ids)
    for h in hyps:
        pieces = tok.target_pieces(h.token_ids)
        # a term tag the model wrote is no text
        t = Translation(strip_tags(tok.decode_target(h.token_ids)), pieces, h.token_ids, h.score, h.log_prob,
                        h.ended_with_eos)
        repairable = source_sentinels or reader.has_sentinel(h.token_ids)
        weights = h.weights if repairable or marked else None  # (T, S)
        text_pieces, text_weights = pieces, weights  # the pieces of t.text, and their attention rows
        if repairable:
            fixed = protect.repair(source_pieces, pieces, weights)
            if fixed.changed:
                t.text, t.spans_inserted, t.spans_removed = tok.decode_pieces(fixed.pieces), fixed.inserted, fixed.removed
                text_pieces = fixed.pieces
                text_weights = None if weights is None else fixed.weights_of_pieces(weights)
        if marked:
            t.text = accelerators.place(t.text, text_pieces, text_weights, source_pieces, marked)
        if shouting:
            t.text = casing.shout(t.text)  # sentinels have no case: the spans come back as written
        if stripped is not None:
            decode = (lambda p: casing.shout(tok.decode_pieces(p))) if shouting else tok.decode_pieces
            t.text = protect.place(stripped, protect.piece_starts(source_pieces), pieces, h.weights, decode)
        if with_attention:
            # the rows are the model's steps: the pieces it wrote, before any repair of the text
            t.attention = h.attention
            t.target_tokens = pieces + (["</s>"] if h.ended_with_eos else [])
        result.hypotheses.append(t)
    return restore(result, masked.spans, masked.text) if masked and masked.spans else result


def lacks_terms(masked: protect.Masked | None, text: str) -> bool:
    """Whether a translation lacks a target term annotated in its source."""
    return masked is not None and not {a.entry for a in masked.annotations} <= masked.terms_used(text)
