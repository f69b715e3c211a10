"""LibreTranslate's API (POST /translate, GET /languages), so its clients (Weblate, Mastodon,
libretranslatepy) work unchanged. Like LibreTranslate, /translate takes JSON or form data (and
query parameters), and answers errors as {"error": ...} with 400 / 403 / 429.

The model was trained on single sentences, so each q entry is split into sentences first (format
'html': into the text runs between tags, then those into sentences; see app/markup.py for what is
kept as written). The sentences of all entries are translated as one job, batched together under
one deadline, and each entry is rebuilt from its own translations, its markup and whitespace kept.
With alternatives, alternative k of an entry is made of hypothesis k+1 of each of its sentences.
/v1/translate does none of this: it translates each text as one sequence."""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import APIRouter, Request
from pydantic import ValidationError

from app import markup
from app.errors import ApiError, describe_validation
from app.protocol import DetectedLanguage, Language, LTTranslateRequest, LTTranslateResponse
from app.registry import ServedModel
from app.routers import ServiceDep, errors
from app.routers.models import languages
from app.scheduler import BatchKey
from app.service import Service, item_name

router = APIRouter(tags=["libretranslate"])

_BODY_SCHEMA = LTTranslateRequest.model_json_schema()
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


async def read_body(request: Request) -> LTTranslateRequest:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in _FORM_TYPES or not content_type:
        fields: dict = dict(request.query_params)
        form = await request.form()
        fields.update({k: v for k, v in form.items() if isinstance(v, str)})
        if len(form.getlist("q")) > 1:  # q repeated: a list of texts
            fields["q"] = [v for v in form.getlist("q") if isinstance(v, str)]
    elif content_type == "application/json" or content_type.endswith("+json"):
        try:
            fields = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"malformed JSON: {e}") from None
        if not isinstance(fields, dict):
            raise ApiError(400, "the JSON body must be an object with q, source and target")
    else:
        raise ApiError(400, f"unsupported content type {content_type!r}; send application/json or form data")
    try:
        return LTTranslateRequest.model_validate(fields)
    except ValidationError as e:
        raise ApiError(400, describe_validation(e.errors())) from None


@router.post("/translate", response_model=LTTranslateResponse, response_model_exclude_none=True,
             responses=errors(400, 403, 429, 503, 504), summary="Translate (LibreTranslate-compatible)",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": _BODY_SCHEMA},
                 "application/x-www-form-urlencoded": {"schema": _BODY_SCHEMA}}}})
async def translate(request: Request, service: ServiceDep):
    """q may be a string or a list; source 'auto' resolves when one source language is served."""
    body = await read_body(request)
    service.check_api_key(body.api_key or request.headers.get("x-api-key"))
    model, auto = service.resolve(body.source, body.target)
    texts = [body.q] if isinstance(body.q, str) else body.q
    if body.format == "html":
        service.check_texts(texts, "q", allow_blank=True)  # html without text comes back as it is
        split, join = markup.split_html_sentences, markup.join_html
    else:
        service.check_texts(texts, "q")
        split, join = markup.split_sentences, markup.interleave
    documents = [split(text) for text in texts]
    hypotheses = await translate_sentences(request, service, model, documents, n_best=body.alternatives + 1)
    versions = [rebuild(between, per_sentence, join) for (between, _), per_sentence in zip(documents, hypotheses)]
    translated = [v[0] for v in versions]
    alternatives = [v[1:] for v in versions] if body.alternatives else None
    detected = DetectedLanguage(confidence=100.0, language=model.source) if auto else None
    if isinstance(body.q, str):
        return LTTranslateResponse(translatedText=translated[0], alternatives=alternatives and alternatives[0],
                                   detectedLanguage=detected)
    return LTTranslateResponse(translatedText=translated, alternatives=alternatives,
                               detectedLanguage=detected and [detected] * len(texts))


async def translate_sentences(request: Request, service: Service, model: ServedModel,
                              documents: list[tuple[list[str], list[str]]], n_best: int) -> list[list[list[str]]]:
    """The n_best hypotheses (texts) of each sentence of each document, all sentences in one job."""
    sentences = [(i, sentence) for i, (_, pieces) in enumerate(documents) for sentence in pieces]
    limit = service.settings.max_segments
    if len(sentences) > limit:
        raise ApiError(400, f"q splits into {len(sentences)} sentences; at most {limit} per request "
                       "(NMT_MAX_SEGMENTS): send fewer or shorter texts")
    if not sentences:
        return [[] for _ in documents]
    sources = [service.encode_text(model, sentence, f"a sentence of {item_name('q', i, len(documents))}")
               for i, sentence in sentences]
    key = BatchKey(model.id, beam_size=max(service.settings.default_beam_size, n_best), n_best=n_best)
    results = iter((await service.translate(request, key, sources)).results)
    return [[[h.text for h in next(results).hypotheses] for _ in pieces] for _, pieces in documents]


def rebuild(between: list[str], per_sentence: list[list[str]], join: Callable[..., str]) -> list[str]:
    """A document's best translation, then its alternatives: version k takes hypothesis k of
    every sentence (as many versions as its sentence with the fewest hypotheses has)."""
    count = min((len(hypotheses) for hypotheses in per_sentence), default=1)
    return [join(between, [hypotheses[k] for hypotheses in per_sentence]) for k in range(count)]


@router.get("/languages", response_model=list[Language], summary="Languages (LibreTranslate-compatible)")
async def list_languages(service: ServiceDep):
    return languages(service.registry)
