"""POST /translate_file and GET /download_file/{id}.{name}, as LibreTranslate has them: a
multipart upload (`file`, `source`, `target`, `api_key`) answered with {"translatedFileUrl": ...},
where the translated file waits NMT_FILE_TTL_S under its original name with the target's code
added ('guide.docx' -> 'guide_de.docx').

The file's texts (app/documents/) go through what /translate does: control characters removed,
sentences cut, placeholders and inline tags protected; they are translated in jobs of at most
NMT_MAX_SEGMENTS sentences, all within NMT_FILE_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from app import documents, markup
from app.documents.isolated import DocumentError
from app.errors import ApiError
from app.forms import Upload, read_fields
from app.glossaries import one_stored
from app.protocol import LTTranslateFileResponse
from app.routers import ServiceDep, errors
from app.service import Service
from model.clean import clean_text

router = APIRouter(tags=["libretranslate"])

FILE_FORM = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "source", "target"],
    "properties": {"file": {"type": "string", "format": "binary", "description": "The file; its extension says its "
                                                                                  "format (see /frontend/settings)."},
                   "source": {"type": "string", "description": "Source language code, or 'auto'.", "example": "en"},
                   "target": {"type": "string", "description": "Target language code.", "example": "de"},
                   "api_key": {"type": "string", "description": "API key, when the server requires one."},
                   "glossary": {"type": "string", "description": "JSON object: source term -> the target term the "
                                "translation must use.", "example": '{"file": "Akte"}'},
                   "glossary_id": {"type": "string", "description": "A stored glossary (POST /v2/glossaries)."},
                   "do_not_translate": {"type": "string", "description": "JSON list of terms kept as written.",
                                        "example": '["Nextcloud"]'}}}}}}}


def _text_field(fields: dict, name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"Invalid request: missing {name} parameter")
    return value


def _optional_text(fields: dict, name: str) -> str | None:
    value = fields.get(name)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"Invalid request: {name} must be a string")
    return value or None


@router.post("/translate_file", response_model=LTTranslateFileResponse,
             responses=errors(400, 403, 413, 429, 503, 504), summary="Translate a file (LibreTranslate-compatible)",
             openapi_extra=FILE_FORM)
async def translate_file(request: Request, service: ServiceDep):
    """Formats: plain text, HTML, SubRip subtitles, gettext catalogs (untranslated entries filled
    and marked fuzzy), Word, PowerPoint, OpenDocument text and presentations, EPUB."""
    s = service.settings
    if not s.files_translation:
        raise ApiError(403, "Files translation are disabled on this server.")
    started = time.monotonic()
    fields, files = await read_fields(request, max_fields=service.settings.max_form_fields)
    upload = files.get("file")
    if upload is None or not upload.filename:
        raise ApiError(400, "Invalid request: missing file parameter")
    source, target = _text_field(fields, "source"), _text_field(fields, "target")
    key = fields.get("api_key") if isinstance(fields.get("api_key"), str) else None
    key = key or request.headers.get("x-api-key")
    char_limit = await service.admit(request, key)
    file_id, name, _ = await translate_upload(request, service, upload, source, target, fields.get("glossary"),
                                              one_stored(_optional_text(fields, "glossary_id")), fields.get("do_not_translate"),
                                              key, char_limit, started)
    return LTTranslateFileResponse(translatedFileUrl=str(request.url_for("download_file", file=f"{file_id}.{name}")))


async def translate_upload(request: Request, service: Service, upload: Upload, source: str, target: str, glossary,
                           glossary_ids: tuple[str, ...], do_not_translate, key: str | None, char_limit: int,
                           started: float) -> tuple[str, str, int]:
    """An uploaded file translated and kept in the file store (NMT_FILE_TTL_S): (its id there, its
    name, the characters of text it held). For /translate_file and DeepL's /v2/document."""
    s = service.settings
    extension = documents.extension(upload.filename)
    if extension not in documents.extensions():
        raise ApiError(400, f"Invalid request: file format not supported ({extension or 'no extension'}); "
                       f"supported: {', '.join(documents.extensions())}")
    try:
        texts, html = await service.documents.extract(upload.filename, upload.data)
    except DocumentError as e:
        raise ApiError(e.status, f"{upload.filename}: {e.message}") from None
    texts = await asyncio.to_thread(lambda: [clean_text(t) for t in texts])
    characters = sum(len(t) for t in texts)
    if char_limit < s.max_chars and characters > char_limit:  # a key's (or NMT_CHAR_LIMIT's) limit is in force
        raise ApiError(400, f"{upload.filename} holds {characters:,} characters of text; this API key may send at "
                       f"most {char_limit:,} per request")
    try:
        texts, language = await service.translate_file_texts(request, texts, html, source, target, glossary,
                                                             glossary_ids, do_not_translate, key, upload.filename,
                                                             started)
    except markup.TooDeep as e:
        raise ApiError(400, f"{upload.filename}: {e}") from None
    try:
        data = await service.documents.rebuild(upload.filename, upload.data, texts, language)
    except DocumentError as e:
        raise ApiError(e.status, f"{upload.filename}: translated, but {e.message}") from None
    name = documents.output_name(upload.filename, language)
    file_id = await service.files.put(name, data, service.owner(request), characters)
    if file_id is None:
        raise ApiError(413, f"the translated file has {len(data):,} bytes; the server keeps at most "
                       f"{s.file_store_bytes:,} (NMT_FILE_STORE_BYTES)")
    service.metrics.files.labels(extension).inc()
    return file_id, name, characters


@router.get("/download_file/{file}", name="download_file", responses=errors(403, 404, 429, 503),
            summary="Download a translated file (LibreTranslate-compatible)")
async def download_file(request: Request, service: ServiceDep,
                        file: str = Path(description="'<id>.<name>', the last part of translatedFileUrl.",
                                         examples=["5f0c9e1a2b3c4d5e6f708192a3b4c5d6.guide_de.docx"])):
    """The file under its original name with the target language added, for NMT_FILE_TTL_S after
    it was translated."""
    # counted against the caller's rate limit; the id in translatedFileUrl is the capability, and
    # LibreTranslate's clients fetch it without a key
    await service.admit(request, request.headers.get("x-api-key"), key_required=False)
    file_id, _, _ = file.partition(".")
    found = await service.files.get(file_id)
    if found is None:
        raise ApiError(404, f"no translated file {file!r}: it expired (files are kept "
                       f"{service.settings.file_ttl_s:g} s) or never existed")
    return attachment(found.name, found.data)


def attachment(name: str, data: bytes) -> Response:
    """A stored file as a download under its name (/download_file, DeepL's document result)."""
    return Response(data, media_type="application/octet-stream",
                    headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(name)}"})
