"""LibreTranslate's API (POST /translate, GET /languages), so its clients (Weblate, Mastodon,
libretranslatepy) work unchanged. Like LibreTranslate, /translate takes JSON or form data (and
query parameters), and answers errors as {"error": ...} with 400 / 403 / 429."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from pydantic import ValidationError

from app.errors import ApiError, describe_validation
from app.protocol import DetectedLanguage, Language, LTTranslateRequest, LTTranslateResponse
from app.routers import ServiceDep, errors
from app.routers.models import languages
from app.scheduler import BatchKey

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
    if body.format == "html":
        raise ApiError(400, "format 'html' is not supported yet; send plain text with format 'text'")
    model, auto = service.resolve(body.source, body.target)
    texts = [body.q] if isinstance(body.q, str) else body.q
    sources = service.encode(model, texts, "q")
    n_best = body.alternatives + 1
    key = BatchKey(model.id, beam_size=max(service.settings.default_beam_size, n_best), n_best=n_best)
    results = (await service.translate(request, key, sources)).results
    translated = [r.hypotheses[0].text for r in results]
    alternatives = [[h.text for h in r.hypotheses[1:]] for r in results] if body.alternatives else None
    detected = DetectedLanguage(confidence=100.0, language=model.source) if auto else None
    if isinstance(body.q, str):
        return LTTranslateResponse(translatedText=translated[0], alternatives=alternatives and alternatives[0],
                                   detectedLanguage=detected)
    return LTTranslateResponse(translatedText=translated, alternatives=alternatives,
                               detectedLanguage=detected and [detected] * len(texts))


@router.get("/languages", response_model=list[Language], summary="Languages (LibreTranslate-compatible)")
async def list_languages(service: ServiceDep):
    return languages(service.registry)
