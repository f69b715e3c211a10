"""POST /v1/translate: the native API, with n-best, alignments and attention."""

from __future__ import annotations

import math
import time

from fastapi import APIRouter, Header, Request

from app.alignments import Alignment, compose, rounded_array
from app.glossaries import one_stored
from app.protocol import (
    Alternative,
    SpanRepair,
    TermsReport,
    Timing,
    TranslateRequest,
    TranslateResponse,
    TranslationOut,
)
from app.routers import ServiceDep, errors, json_response
from app.service import Service
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
    if body.include_attention:  # its attention goes into the JSON as an array (`translate`)
        out.source_tokens, out.target_tokens = result.source_tokens, best.target_tokens
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
    source, target = service.registry.code(body.source), service.registry.code(body.target)
    options = DecodingOptions(body.beam_size, body.n_best, body.length_penalty, body.max_length,
                              attention=body.alignments or body.include_attention,
                              repetition_penalty=body.repetition_penalty)
    # through a pivot when no model translates source -> target (Service.legs)
    legs = await service.translate_with_options(
        request, texts, source, target, options, body.glossary, one_stored(body.glossary_id), body.do_not_translate, key,
        char_limit, refused={"include_attention": body.include_attention, "n_best > 1": body.n_best > 1,
                             "glossary_id": bool(body.glossary_id)},
        # the attention kept per text: every hypothesis's stored as alignments, the best one's in the response
        attention_copies=(body.n_best if body.alignments else 0) + body.include_attention)
    outs = []
    for leg in legs:  # each leg's: its alignments stored when asked
        outs.append([await translation_out(service, request, leg.model.id, r, body) for r in leg.results])
        for out, result in zip(outs[-1], leg.results):
            out.terms = TermsReport(**result.terms) if result.terms is not None else None
    translations = outs[-1]
    if len(legs) == 2:
        for out, before in zip(outs[1], outs[0]):
            out.terms = before.terms  # the request's terms, as the first leg applied them
            if body.alignments:  # each leg's own, and their composition source -> target
                out.leg_alignment_ids = [before.alignment_id, out.alignment_id]
                stored = [await service.alignments.get(i) if i else None for i in out.leg_alignment_ids]
                composed = compose(*stored, f"{source}-{target}") if all(stored) else None
                out.alignment_id = await service.alignments.put(composed, service.owner(request)) if composed else None
    timing = Timing(queue_ms=round(sum(leg.queue_s for leg in legs) * 1000, 2),
                    compute_ms=round(sum(leg.compute_s for leg in legs) * 1000, 2),
                    total_ms=round((time.perf_counter() - start) * 1000, 2))
    if len(legs) == 1:
        response = TranslateResponse(model=legs[0].model.id, translations=translations, timing=timing)
    else:
        response = TranslateResponse(model=f"{source}-{target}", pivot=legs[0].model.target,
                                     translations=translations, timing=timing)
    content = response.model_dump(mode="json", exclude_none=True)
    if body.include_attention:  # each translation's attention, written from its array
        for out, result in zip(content["translations"], legs[-1].results):
            out["attention"] = rounded_array(result.hypotheses[0].attention)
    return json_response(content)
