"""POST /v1/translate: the native API, with n-best, alignments and attention."""

from __future__ import annotations

import math
import time
from functools import partial

from fastapi import APIRouter, Header, Request

from app.alignments import Alignment, compose, rounded
from app.errors import ApiError
from app.protocol import (
    Alternative,
    SpanRepair,
    TermsReport,
    Timing,
    TranslateRequest,
    TranslateResponse,
    TranslationOut,
)
from app.registry import language_name
from app.routers import ServiceDep, errors
from app.service import Service, client_work
from model.options import DecodingOptions
from model.results import Translation, TranslationResult

router = APIRouter(tags=["translate"])


def finite(score: float) -> float:
    # JSON has no -inf; a hypothesis that underflowed (fp16) still gets a comparable score
    return score if math.isfinite(score) else -1e30


async def translation_out(service: Service, request: Request, model_id: str, result: TranslationResult,
                          body: TranslateRequest):
    stored = {}
    if body.alignments:
        for k, h in enumerate(result.hypotheses):
            stored[k] = await service.alignments.put(Alignment(model_id, result.source_tokens, h.target_tokens,
                                                               h.attention), service.owner(request))

    def repair(h: Translation) -> SpanRepair | None:
        if not h.repaired:
            return None
        known = len(result.spans)
        return SpanRepair(inserted=[result.spans[k] for k in h.spans_inserted],
                          removed=[result.spans[k] for k in h.spans_removed if k < known],
                          removed_unknown=sum(k >= known for k in h.spans_removed))

    best, *others = result.hypotheses
    out = TranslationOut(
        text=best.text, score=finite(best.score), alignment_id=stored.get(0), span_repair=repair(best),
        alternatives=[Alternative(text=h.text, score=finite(h.score), alignment_id=stored.get(k + 1),
                                  span_repair=repair(h)) for k, h in enumerate(others)])
    if body.include_attention:
        out.source_tokens, out.target_tokens = result.source_tokens, best.target_tokens
        out.attention = rounded(best.attention)
    return out


@router.post("/v1/translate", response_model=TranslateResponse, response_model_exclude_none=True,
             responses=errors(400, 403, 413, 429, 503, 504), summary="Translate one text or a list of texts")
async def translate(body: TranslateRequest, request: Request, service: ServiceDep,
                    x_api_key: str | None = Header(None, description="API key (alternative to body api_key).",
                                                   examples=["my-key"])):
    """Texts are batched with other requests' texts decoded with the same options; the response
    holds exactly this request's translations, in input order."""
    start = time.perf_counter()
    texts = [body.text] if isinstance(body.text, str) else body.text
    key = body.api_key or x_api_key
    char_limit = await service.admit(request, key, cost=len(texts))
    # the served codes ('pt-BR' -> an Argos model's 'pb'): model ids and alignments name these
    body = body.model_copy(update={"source": service.registry.code(body.source),
                                   "target": service.registry.code(body.target)})
    # through a pivot when no model translates source -> target (Service.legs)
    legs = service.legs(body.source, body.target, {"include_attention": body.include_attention,
                                                   "n_best > 1": body.n_best > 1, "glossary_id": bool(body.glossary_id)})
    if len(legs) == 1:
        return await translate_one_hop(body, request, service, key, texts, char_limit, start)

    def on(leg):  # the request as one leg translates it: its languages and terms
        glossary, keep = service.leg_terms(leg, body.glossary, body.do_not_translate)
        return body.model_copy(update={"source": leg.source, "target": leg.target, "glossary": glossary,
                                       "do_not_translate": keep})

    first = await translate_one_hop(on(legs[0]), request, service, key, texts, char_limit, start)
    middle = [t.text for t in first.translations]
    second = await translate_one_hop(on(legs[1]), request, service, key, middle, char_limit, start)
    pivot = legs[0].target
    for out, before in zip(second.translations, first.translations):
        out.terms = before.terms  # the request's terms, as the first leg applied them
        if body.alignments:  # each leg's own, and their composition source -> target
            out.leg_alignment_ids = [before.alignment_id, out.alignment_id]
            stored = [await service.alignments.get(i) if i else None for i in out.leg_alignment_ids]
            composed = compose(*stored, f"{body.source}-{body.target}") if all(stored) else None
            out.alignment_id = await service.alignments.put(composed, service.owner(request)) if composed else None
    timing = Timing(queue_ms=first.timing.queue_ms + second.timing.queue_ms,
                    compute_ms=first.timing.compute_ms + second.timing.compute_ms,
                    total_ms=round((time.perf_counter() - start) * 1000, 2))
    return TranslateResponse(model=f"{body.source}-{body.target}", pivot=pivot, translations=second.translations,
                             timing=timing)


def _check_attention_size(results: list[TranslationResult], body: TranslateRequest, limit: int) -> None:
    """A 413 when the attention this request asks for (every hypothesis's, stored as alignments;
    the best one's, in the response) holds more than `limit` values (NMT_MAX_ATTENTION_VALUES)."""
    values = 0
    for r in results:
        if body.alignments:
            values += sum(h.attention.size for h in r.hypotheses if h.attention is not None)
        if body.include_attention and r.hypotheses[0].attention is not None:
            values += r.hypotheses[0].attention.size
    if values > limit:
        raise ApiError(413, f"the attention asked for holds {values:,} values (layers x heads x target x source "
                       f"tokens, per text and hypothesis); at most {limit:,} per request (NMT_MAX_ATTENTION_VALUES): "
                       "send fewer or shorter texts, or fewer hypotheses")


async def translate_one_hop(body: TranslateRequest, request: Request, service: Service, key: str | None,
                            texts: list[str], char_limit: int, start: float) -> TranslateResponse:
    """/v1/translate's work with one model."""
    texts = service.accept_texts(texts, "text", char_limit=char_limit)  # cleaned, as the model reads them
    resolved = await service.resolve_each(body.source, body.target, texts, "text")
    model = resolved[0][0]
    other = next((i for i, (m, _) in enumerate(resolved) if m.id != model.id), None)
    if other is not None:  # one model per request: its response names it
        raise ApiError(400, f"source 'auto': text[0] looks {language_name(model.source)} and text[{other}] "
                       f"{language_name(resolved[other][0].source)}; send one language per request (or use /translate, "
                       "which translates each text from its own language)")
    terms = await service.terminology(body.glossary, body.glossary_id, body.do_not_translate, key, model)
    plans = await client_work(sum(map(len, texts)), partial(service.prepare, model, texts, "text", terms))
    length_penalty = model.length_penalty if body.length_penalty is None else body.length_penalty
    options = DecodingOptions(body.beam_size, body.n_best, length_penalty, body.max_length,
                              attention=body.alignments or body.include_attention,
                              repetition_penalty=body.repetition_penalty)
    # a text whose best translation lacks an annotated term: again, its terms as sentinels
    outcome = await service.translate_plans(request, model, plans, options,
                                            partial(service.prepare, model, texts, "text", terms, "spans"))
    results = outcome.results
    _check_attention_size(results, body, service.settings.max_attention_values)
    translations = [await translation_out(service, request, model.id, r, body) for r in results]
    for out, result in zip(translations, results):
        out.terms = TermsReport(**result.terms) if result.terms is not None else None
    timing = Timing(queue_ms=round(outcome.queue_s * 1000, 2), compute_ms=round(outcome.compute_s * 1000, 2),
                    total_ms=round((time.perf_counter() - start) * 1000, 2))
    return TranslateResponse(model=model.id, translations=translations, timing=timing)
