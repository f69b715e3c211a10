"""LibreTranslate's API (POST /translate, POST /detect, GET /languages), so its clients (Weblate,
Mastodon, libretranslatepy) work unchanged. Like LibreTranslate, /translate takes JSON or form data (and
query parameters), and answers errors as {"error": ...} with 400 / 403 / 429.

The model was trained on single sentences, so each q entry is split into sentences first (format
'html': into runs of text and inline tags between block tags, then those into sentences; see
app/markup.py for what is kept as written). With a model whose vocabulary has sentinels
(model/protect.py), placeholders, URLs, Weblate's [X12X] masks and inline tags go through the
model as sentinels and come back exactly as written. The sentences of all entries are translated as
one job, batched together under
one deadline, and each entry is rebuilt from its own translations, its markup and whitespace kept.
With alternatives, alternative k of an entry is made of hypothesis k+1 of each of its sentences.
/v1/translate does none of this: it translates each text as one sequence.

/detect tells the likeliest languages of each text, served or not; source 'auto' detects each text's
language (app/language.py), and a text in a language no model translates is a 400 naming it."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError

from app import documents
from app.errors import ApiError, describe_validation
from app.forms import read_fields
from app.glossaries import one_stored
from app.protocol import (
    DetectedLanguage,
    Language,
    LTDetectRequest,
    LTFrontendLanguages,
    LTFrontendSettings,
    LTLanguageRef,
    LTSuggestRequest,
    LTSuggestResponse,
    LTTranslateRequest,
    LTTranslateResponse,
    TermsReport,
)
from app.registry import reported_code
from app.routers import ServiceDep, errors
from app.suggestions import SuggestionsFull

router = APIRouter(tags=["libretranslate"])


def request_body(model: type[BaseModel]) -> dict:
    """OpenAPI for a body read by read_body (the route declares none, so FastAPI cannot see it)."""
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema},
                                                          "application/x-www-form-urlencoded": {"schema": schema}}}}


async def read_body(request: Request, model: type[BaseModel]) -> BaseModel:
    """The body (JSON or form data, app/forms.py) validated as `model`, or a 400 saying what is wrong."""
    fields, _ = await read_fields(request, [name for name, field in model.model_fields.items() if field.is_required()],
                                  request.app.state.service.settings.max_form_fields)
    try:
        return model.model_validate(fields)
    except ValidationError as e:
        raise ApiError(400, describe_validation(e.errors())) from None


@router.post("/translate", response_model=LTTranslateResponse, response_model_exclude_none=True,
             responses=errors(400, 403, 429, 503, 504), summary="Translate (LibreTranslate-compatible)",
             openapi_extra=request_body(LTTranslateRequest))
async def translate(request: Request, service: ServiceDep):
    """q may be a string or a list; with source 'auto' each text is translated from its own
    detected language (app/language.py)."""
    body = await read_body(request, LTTranslateRequest)
    texts = [body.q] if isinstance(body.q, str) else body.q
    key = body.api_key or request.headers.get("x-api-key")
    char_limit = await service.admit(request, key, cost=len(texts))
    html = body.format == "html"
    texts = service.accept_texts(texts, "q", allow_blank=html, char_limit=char_limit)  # html without text: as it is
    # through a pivot when no model translates source -> target (Service.legs)
    done = await service.translate_texts(request, texts, html, body.source, body.target, body.glossary,
                                         one_stored(body.glossary_id), body.do_not_translate, key, n_best=body.alternatives + 1,
                                         field="q", charge=True)
    translated = [v[0] for v in done.versions]
    alternatives = [v[1:] for v in done.versions] if body.alternatives else None
    detected = None if body.source != "auto" else [
        DetectedLanguage(confidence=round(confidence, 1), language=reported_code(language))
        for language, confidence in done.sources]
    reports = done.reports and [TermsReport(**r) for r in done.reports]
    if isinstance(body.q, str):
        return LTTranslateResponse(translatedText=translated[0], alternatives=alternatives and alternatives[0],
                                   detectedLanguage=detected and detected[0], terms=reports and reports[0])
    return LTTranslateResponse(translatedText=translated, alternatives=alternatives, detectedLanguage=detected,
                               terms=reports)


@router.post("/detect", response_model=list[DetectedLanguage] | list[list[DetectedLanguage]],
             responses={200: {"description": "The served languages with their confidence, best first (a list per "
                              "text when q was a list); [] for a text without letters.",
                              "content": {"application/json": {"example": [{"confidence": 97.3, "language": "de"},
                                                                          {"confidence": 2.7, "language": "en"}]}}},
                        **errors(400, 403, 429)},
             summary="Detect the language (LibreTranslate-compatible)", openapi_extra=request_body(LTDetectRequest))
async def detect(request: Request, service: ServiceDep):
    """The likeliest languages of each text among the 75 the detector knows (or NMT_DETECT_LANGUAGES),
    served or not, best first."""
    body = await read_body(request, LTDetectRequest)
    texts = [body.q] if isinstance(body.q, str) else body.q
    char_limit = await service.admit(request, body.api_key or request.headers.get("x-api-key"), cost=len(texts))
    answers = [[DetectedLanguage(confidence=round(confidence, 1), language=reported_code(language))
                for language, confidence in found] for found in await service.detect(texts, "q", char_limit)]
    return answers[0] if isinstance(body.q, str) else answers


@router.get("/languages", response_model=list[Language], summary="Languages (LibreTranslate-compatible)")
async def list_languages(service: ServiceDep):
    return [Language(code=c, name=n, targets=t) for c, n, t in service.registry.languages()]


@router.get("/frontend/settings", response_model=LTFrontendSettings,
            summary="Settings a front end needs (LibreTranslate-compatible)")
async def frontend_settings(service: ServiceDep):
    """The real limits and switches of this server, for LibreTranslate's web UI and clients."""
    s = service.settings
    sources = service.registry.sources()
    targets = [t for source in sources for t in service.registry.targets(source)]
    target = targets[0] if targets else sources[0]
    # the key store is SQLite or Redis: off the event loop (a locked file or an unreachable Redis waits seconds)
    keys_stored = bool(s.api_keys) or await asyncio.to_thread(bool, service.keys)
    return LTFrontendSettings(
        charLimit=min(s.char_limit or s.max_chars, s.max_chars), frontendTimeout=500,
        apiKeys=keys_stored, keyRequired=s.require_api_key or bool(s.api_keys),
        suggestions=s.suggestions, filesTranslation=s.files_translation,
        supportedFilesFormat=documents.extensions() if s.files_translation else [],
        language=LTFrontendLanguages(source=LTLanguageRef(code="auto", name="Auto Detect"),
                                     target=LTLanguageRef(code=reported_code(target),
                                                          name=service.registry.name(target))))


@router.post("/suggest", response_model=LTSuggestResponse, responses=errors(400, 403, 429, 507),
             summary="Suggest a better translation (LibreTranslate-compatible)",
             openapi_extra=request_body(LTSuggestRequest))
async def suggest(request: Request, service: ServiceDep):
    """Stored for the operator (NMT_SUGGESTIONS_DB); off unless NMT_SUGGESTIONS is set, as in LibreTranslate."""
    if not service.settings.suggestions:
        raise ApiError(403, "Suggestions are disabled on this server.")
    body = await read_body(request, LTSuggestRequest)
    char_limit = await service.admit(request, body.api_key or request.headers.get("x-api-key"))
    [q] = service.accept_texts([body.q], "q", char_limit=char_limit)
    [s] = service.accept_texts([body.s], "s", char_limit=char_limit)
    service.resolve(body.source, body.target)  # a pair this server translates
    try:
        await asyncio.to_thread(service.suggestions.add, q, s, body.source, body.target)
    except SuggestionsFull as e:
        raise ApiError(507, str(e)) from None
    return LTSuggestResponse(success=True)


@router.get("/spec", summary="The API description (LibreTranslate's /spec)")
async def spec(request: Request):
    """This server's OpenAPI document (3.1; LibreTranslate serves Swagger 2.0 here), the one /docs shows."""
    return request.app.openapi()
