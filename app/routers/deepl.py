"""DeepL's API (v2), so DeepL clients and the tools built on them (the `deepl` Python library,
Weblate's DeepL machine translation, ...) work against this server unchanged:

    POST /v2/translate                   text (a list), target_lang, source_lang, glossary_id or glossary_ids,
                                         tag_handling, split_sentences, ignore_tags, formality, model_type
    GET  /v2/languages                   ?type=source|target
    GET  /v2/usage                       characters translated this month by this key
    POST /v2/glossaries                  name, source_lang, target_lang, entries, entries_format (tsv|csv)
    GET  /v2/glossaries                  this key's glossaries
    GET  /v2/glossaries/{id}             one of them
    GET  /v2/glossaries/{id}/entries     its entries as TSV
    DELETE /v2/glossaries/{id}
    GET  /v2/glossary-language-pairs
    POST /v2/document                    file, target_lang, source_lang, glossary_id(s), formality, output_format
    POST /v2/document/{id}               document_key: its status (done once the upload is answered)
    POST /v2/document/{id}/result        document_key: the translated file

`Authorization: DeepL-Auth-Key <key>` is one of our API keys (NMT_API_KEYS, `nmt keys`) with its
limits; on a server without keys any key is accepted and the clients share one set of
glossaries. Errors are DeepL's shape, {"message": ...} (app/errors.py). Language codes are DeepL's
(upper case; EN-GB and EN-US as targets are English). Texts are translated as /translate
translates them (sentences, protected spans; tag_handling html or xml: as HTML), cut where
split_sentences says, the content of ignore_tags kept as written; formality 'more' or 'less'
gets DeepL's 400 for a target language without formality (no served model has one), the
'prefer_' values fall back. Several stored glossaries (glossary_ids, up to 5) apply together; a
source term two of them give different targets is a 400. A model_type is answered with
model_type_used 'latency_optimized' (the one kind of model here). Style rules (style_id),
translation memories (translation_memory_id) and custom_instructions are a 400: none is here,
and a translation that ignored them would look like one that followed them. Options that only
steer DeepL's own model or its sentence boundaries in XML (context, preserve_formatting,
outline_detection, splitting_tags, non_splitting_tags, tag_handling_version) are accepted
without effect.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from app import documents
from app.errors import ApiError
from app.forms import Upload, query_once, read_fields
from app.glossaries import MAX_ENTRIES, new_glossary, owner_of, parse_entries, stored_bytes
from app.markup import Reading
from app.protocol import DeepLErrorResponse
from app.registry import reported_code
from app.routers import ServiceDep
from app.routers.files import attachment, translate_upload
from app.service import Service
from model.clean import lone_surrogate
from model.sentences import Splitting
from model.terms import TermError

router = APIRouter(prefix="/v2", tags=["deepl"])


def errors(*codes: int) -> dict:
    """OpenAPI entries for the error responses of a route here, in DeepL's shape."""
    meanings = {400: "Bad input: the message says what is wrong and what is allowed.", 403: "Key missing or wrong.",
                404: "No such glossary for this key.", 413: "The request body is too large.",
                429: "Too many requests for this key; retry later.", 503: "A worker failed; retry.",
                504: "The request's deadline passed."}
    return {code: {"model": DeepLErrorResponse, "description": meanings[code]} for code in codes}


GlossaryId = Annotated[str, Path(description="The glossary's id, as POST /v2/glossaries returned it.",
                                 examples=["def3a26b-3e84-45b3-84ae-0c0aaf3525f7"])]

UNLIMITED = 10**12  # DeepL Pro's "no limit"
REGIONAL_TARGETS = {"en": ["EN-GB", "EN-US"], "pt": ["PT-BR", "PT-PT"], "zh": ["ZH-HANS", "ZH-HANT"]}


def auth_key(request: Request, fields: dict | None = None) -> str | None:
    header = request.headers.get("authorization", "")
    if header.startswith("DeepL-Auth-Key "):
        return header[len("DeepL-Auth-Key "):].strip() or None
    value = (fields or {}).get("auth_key")
    return value if isinstance(value, str) and value else None


async def admit(request: Request, service: Service, key: str | None, cost: int = 1) -> tuple[str | None, int]:
    """Count the call against the key's limits; returns the key that stands for the client (None
    on a server without keys, where every DeepL client's own key is accepted) and the characters
    a text may have."""
    s = service.settings
    keys_in_force = bool(s.api_keys) or s.require_api_key or await asyncio.to_thread(bool, service.keys)
    if keys_in_force and not key:
        raise ApiError(403, "an API key is required: Authorization: DeepL-Auth-Key <key>")
    key = key if keys_in_force else None
    return key, await service.admit(request, key, cost)


def our_code(code, field: str, registry) -> str:
    """DeepL's 'EN-GB' -> our 'en', 'PT-BR' -> 'pb' where an Argos 'pb' model is served
    (Registry.code)."""
    if not isinstance(code, str) or not code:
        raise ApiError(400, f"Value for '{field}' not supported.")
    return registry.code(code)


MAX_NAME_CHARS = 1024  # a glossary's name: it comes back in every listing of the key's glossaries

# DeepL's split_sentences: where a text is cut into the sequences translated one by one
SPLITTING = {"1": Splitting(), "nonewlines": Splitting(newlines=False), "0": Splitting(punctuation=False, newlines=False)}
FORMALITIES = ("default", "prefer_more", "prefer_less")  # "more" and "less": languages with formality (none here)
MODEL_TYPES = ("latency_optimized", "quality_optimized", "prefer_quality_optimized")
MAX_GLOSSARIES = 5  # glossary_ids of one request, as DeepL allows
# what DeepL keeps that steers its model, none of which is here: a request naming one gets a 400
NOT_HERE = {"style_id": "style rules", "translation_memory_id": "translation memories",
            "translation_memory_threshold": "translation memories", "custom_instructions": "custom instructions"}


def sentence_splitting(value, tag_handling: bool) -> Splitting:
    """DeepL's default is '1' for text, 'nonewlines' with tag_handling."""
    if value is None or value == "":
        return SPLITTING["nonewlines" if tag_handling else "1"]
    if str(value) not in SPLITTING or isinstance(value, bool):
        raise ApiError(400, f"Value for 'split_sentences' not supported: {value!r}; '0', '1' or 'nonewlines'.")
    return SPLITTING[str(value)]


def ignored_tags(value) -> frozenset[str]:
    """DeepL's ignore_tags: tag names, comma-separated (or a list of them), whose content is kept
    as written."""
    values = [value] if isinstance(value, str) else value or []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ApiError(400, "Value for 'ignore_tags' not supported: give tag names, comma-separated.")
    names = {name.strip().lower() for v in values for name in v.split(",")} - {""}
    bad = next((name for name in sorted(names) if not re.fullmatch(r"[a-z_][\w.:-]*", name)), None)
    if bad is not None:
        raise ApiError(400, f"Value for 'ignore_tags' not supported: {bad[:40]!r} is not a tag name.")
    return frozenset(names)


def stored_glossaries(fields: dict, source: str) -> tuple[str, ...]:
    """The request's stored glossaries: glossary_id (one), or glossary_ids (up to MAX_GLOSSARIES:
    a list, or comma-separated as DeepL's clients send them in a form), not both; and (as DeepL
    has it) only with a source_lang."""
    one, several = fields.get("glossary_id"), fields.get("glossary_ids")
    if not isinstance(one, str | None):
        raise ApiError(400, "Parameter 'glossary_id' must be one glossary id (a string); several go in "
                       "'glossary_ids'.")
    if one and several:
        raise ApiError(400, "Use either 'glossary_id' or 'glossary_ids', not both.")
    if several is None or several == "":
        ids = (one,) if one else ()
    else:
        # (at most a few more parts than allowed: a 400 below either way, without splitting megabytes)
        several = several.split(",", 4 * MAX_GLOSSARIES) if isinstance(several, str) else several
        if not isinstance(several, list) or not all(isinstance(i, str) for i in several):
            raise ApiError(400, "Parameter 'glossary_ids' must be a list of glossary ids.")
        ids = tuple(dict.fromkeys(i.strip() for i in several if i.strip()))
        if len(ids) > MAX_GLOSSARIES:
            raise ApiError(400, f"Parameter 'glossary_ids' names more than {MAX_GLOSSARIES} glossaries; at most "
                           f"{MAX_GLOSSARIES} per request.")
    if ids and source == "auto":
        raise ApiError(400, "Use of a glossary requires the 'source_lang' parameter to be specified.")
    return ids


def refuse_what_is_not_here(fields: dict) -> None:
    """DeepL's stored style rules, translation memories and custom instructions change what its
    model writes; this server has none of them, so a request that names one gets a 400, not a
    translation that silently ignores it."""
    for name, what in NOT_HERE.items():
        if fields.get(name) not in (None, "", []):
            raise ApiError(400, f"Parameter '{name}' not supported: this server has no {what}; its models follow "
                           "glossaries (glossary_id, glossary_ids).")


def model_type_used(fields: dict) -> str | None:
    """DeepL's model_type: each value is served by this server's one kind of model, small
    Transformers, which DeepL would call latency_optimized; the answer says so, as DeepL's does
    when the request names a model_type (None: it did not)."""
    value = fields.get("model_type")
    if value is None or value == "":
        return None
    if value not in MODEL_TYPES:
        raise ApiError(400, f"Value for 'model_type' not supported: {value!r}; {', '.join(map(repr, MODEL_TYPES))}.")
    return "latency_optimized"


def check_tag_handling_version(value) -> None:
    """DeepL's two versions of its tag handling; the markup here is read one way (app/markup.py)."""
    if value not in (None, "", "v1", "v2"):
        raise ApiError(400, f"Value for 'tag_handling_version' not supported: {value!r}; 'v1' or 'v2'.")


def check_formality(value) -> None:
    """No served model has a formal and an informal register, so only the values DeepL accepts for
    such target languages pass ('more' and 'less' fail there; the 'prefer_' ones fall back)."""
    if value is None or value == "" or value in FORMALITIES:
        return
    if value in ("more", "less"):
        raise ApiError(400, "'formality' is not supported for given 'target_lang'; 'prefer_more' or "
                       "'prefer_less' fall back to the default where a language has no formality.")
    raise ApiError(400, f"Value for 'formality' not supported: {value!r}; 'default', 'more', 'less', 'prefer_more' "
                   "or 'prefer_less'.")


def deepl_code(code: str) -> str:
    """Our code as DeepL writes it: 'en' -> 'EN', Argos's 'pb' -> 'PT-BR', 'zt' -> 'ZH-HANT'."""
    return reported_code(code).upper()


@router.post("/translate", summary="Translate (DeepL-compatible)", responses=errors(400, 403, 413, 429, 503, 504))
async def translate(request: Request, service: ServiceDep):
    fields, _ = await read_fields(request, max_fields=service.settings.max_form_fields)
    texts = fields.get("text")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "Parameter 'text' not specified: give one or more texts.")
    key, char_limit = await admit(request, service, auth_key(request, fields), cost=len(texts))
    target = our_code(fields.get("target_lang"), "target_lang", service.registry)
    source = our_code(fields["source_lang"], "source_lang", service.registry) if fields.get("source_lang") else "auto"
    tag_handling = fields.get("tag_handling")
    if tag_handling not in (None, "", "html", "xml"):
        raise ApiError(400, f"Value for 'tag_handling' not supported: {tag_handling!r}; 'html' or 'xml'.")
    html = bool(tag_handling)
    reading = Reading(sentence_splitting(fields.get("split_sentences"), html), ignored_tags(fields.get("ignore_tags")))
    check_formality(fields.get("formality"))
    check_tag_handling_version(fields.get("tag_handling_version"))
    refuse_what_is_not_here(fields)
    model_type = model_type_used(fields)
    glossary_ids = stored_glossaries(fields, source)
    texts = service.accept_texts(texts, "text", allow_blank=html, char_limit=char_limit)
    # through a pivot when no model translates source -> target (Service.legs)
    done = await service.translate_texts(request, texts, html, source, target, None, glossary_ids, None,
                                         key, n_best=1, field="text", charge=True, reading=reading)
    translated, sources = [v[0] for v in done.versions], [language for language, _ in done.sources]
    characters = sum(len(t) for t in texts)
    await service.count_usage(owner_of(key), characters)
    return {"translations": [{"detected_source_language": deepl_code(language), "text": t, "billed_characters": len(x),
                              **({"model_type_used": model_type} if model_type else {})}
                             for t, x, language in zip(translated, texts, sources)]}


@router.get("/languages", summary="Languages (DeepL-compatible)", responses=errors(400),
            dependencies=[Depends(query_once)])
async def languages(request: Request, service: ServiceDep,
                    type: str = Query("source", description="'source' or 'target' (DeepL's clients may send it "
                                      "as a form body instead).", examples=["target"])):
    if type == "source" and await request.body():  # DeepL's clients send GET parameters as a form body
        fields, _ = await read_fields(request, max_fields=service.settings.max_form_fields)
        type = fields.get("type", type) if isinstance(fields.get("type"), str) else type
    if type not in ("source", "target"):
        raise ApiError(400, f"Value for 'type' not supported: {type!r}; 'source' or 'target'.")
    registry = service.registry
    if type == "source":
        return [{"language": deepl_code(c), "name": registry.name(c)} for c in registry.sources()]
    targets = sorted({t for source in registry.sources() for t in registry.targets(source)})
    return [{"language": code, "name": registry.name(t), "supports_formality": False}
            for t in targets for code in REGIONAL_TARGETS.get(t, [deepl_code(t)])]


@router.get("/usage", summary="Characters translated this month (DeepL-compatible)", responses=errors(403, 429))
async def usage(request: Request, service: ServiceDep):
    key, _ = await admit(request, service, auth_key(request))
    return {"character_count": await service.count_usage(owner_of(key), 0), "character_limit": UNLIMITED}


@router.get("/glossary-language-pairs", summary="Language pairs a glossary can have (DeepL-compatible)",
            responses=errors(403, 429))
async def glossary_language_pairs(request: Request, service: ServiceDep):
    await admit(request, service, auth_key(request))
    pairs = [(s, t) for s in service.registry.sources() for t in service.registry.targets(s)
             if f"{s}-{t}" in service.registry.models]
    return {"supported_languages": [{"source_lang": s, "target_lang": t} for s, t in pairs]}


@router.post("/glossaries", status_code=201, summary="Create a glossary (DeepL-compatible)", responses=errors(400, 403, 413, 429))
async def create_glossary(request: Request, service: ServiceDep):
    fields, _ = await read_fields(request, max_fields=service.settings.max_form_fields)
    key, _ = await admit(request, service, auth_key(request, fields))
    name = fields.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ApiError(400, "Parameter 'name' not specified.")
    if lone_surrogate(name) is not None:
        raise ApiError(400, "Parameter 'name' holds a lone surrogate, which is not valid Unicode: send UTF-8 text.")
    if len(name.strip()) > MAX_NAME_CHARS:
        raise ApiError(400, f"Parameter 'name' has {len(name.strip()):,} characters; at most {MAX_NAME_CHARS:,}.")
    source = our_code(fields.get("source_lang"), "source_lang", service.registry)
    target = our_code(fields.get("target_lang"), "target_lang", service.registry)
    pairs = {(m.source, m.target) for m in service.registry.models.values()}  # direct models only
    if (source, target) not in pairs:
        raise ApiError(400, f"Unsupported glossary language pair: {source}->{target}; supported: "
                       f"{', '.join(f'{s}->{t}' for s, t in sorted(pairs))}")
    entries = fields.get("entries")
    if not isinstance(entries, str):
        raise ApiError(400, "Parameter 'entries' not specified: source<TAB>target, one entry a line.")
    try:
        parsed = parse_entries(entries, fields.get("entries_format") or "tsv")
    except TermError as e:
        raise ApiError(400, f"Invalid glossary entries provided: {e} (at most {MAX_ENTRIES:,} entries, 1,024 "
                       "characters a term)") from None
    glossary = new_glossary(name.strip(), source, target, parsed, owner_of(key))
    s = service.settings
    kept = await asyncio.to_thread(service.glossaries.list, glossary.owner)
    if len(kept) >= s.max_glossaries_per_key:
        raise ApiError(400, f"this API key has {len(kept)} glossaries, the most it may keep "
                       "(NMT_MAX_GLOSSARIES_PER_KEY): delete one first")
    size = sum(map(stored_bytes, kept)) + stored_bytes(glossary)
    if size > s.max_glossary_bytes_per_key:
        raise ApiError(413, f"this API key's glossaries would take {size:,} bytes; it may keep "
                       f"{s.max_glossary_bytes_per_key:,} (NMT_MAX_GLOSSARY_BYTES_PER_KEY): delete some first")
    await asyncio.to_thread(service.glossaries.put, glossary)
    return JSONResponse(glossary.info(), status_code=201)


async def _glossary(request: Request, service: Service, glossary_id: str):
    key, _ = await admit(request, service, auth_key(request))
    glossary = await asyncio.to_thread(service.glossaries.get, glossary_id, owner_of(key))
    if glossary is None:
        raise ApiError(404, f"Glossary not found: {glossary_id}")
    return glossary, key


@router.get("/glossaries", summary="This key's glossaries (DeepL-compatible)", responses=errors(403, 429))
async def list_glossaries(request: Request, service: ServiceDep):
    key, _ = await admit(request, service, auth_key(request))
    found = await asyncio.to_thread(service.glossaries.list, owner_of(key))
    return {"glossaries": [g.info() for g in found]}


@router.get("/glossaries/{glossary_id}", summary="A glossary (DeepL-compatible)", responses=errors(403, 404, 429))
async def get_glossary(glossary_id: GlossaryId, request: Request, service: ServiceDep):
    glossary, _ = await _glossary(request, service, glossary_id)
    return glossary.info()


@router.get("/glossaries/{glossary_id}/entries", summary="A glossary's entries as TSV (DeepL-compatible)",
            responses={**errors(403, 404, 429), 200: {"content": {"text/tab-separated-values": {}},
                                                      "description": "source<TAB>target, one entry a line"}})
async def glossary_entries(glossary_id: GlossaryId, request: Request, service: ServiceDep):
    glossary, _ = await _glossary(request, service, glossary_id)
    return PlainTextResponse(glossary.tsv(), media_type="text/tab-separated-values")


@router.delete("/glossaries/{glossary_id}", status_code=204, summary="Delete a glossary (DeepL-compatible)",
               responses=errors(403, 404, 429))
async def delete_glossary(glossary_id: GlossaryId, request: Request, service: ServiceDep):
    glossary, key = await _glossary(request, service, glossary_id)
    await asyncio.to_thread(service.glossaries.delete, glossary_id, owner_of(key))
    return Response(status_code=204)


# --- documents -----------------------------------------------------------------------------------
# A document is translated while its upload waits (as /translate_file does), so its status is
# "done" from the start. The file store's id (32 hex digits) is the capability: DeepL's
# document_id is its first half, document_key the second, and the status and result routes need
# both.
DocumentId = Annotated[str, Path(description="The document_id POST /v2/document returned.", max_length=64,
                                 examples=["5f0c9e1a2b3c4d5e"])]


@router.post("/document", summary="Translate a document (DeepL-compatible)",
             responses=errors(400, 403, 413, 429, 503, 504))
async def upload_document(request: Request, service: ServiceDep):
    """Multipart: `file` (its name's extension says its format; `filename` may name it instead),
    `target_lang`, optional `source_lang`, `glossary_id` or `glossary_ids`, `formality`, `output_format` (only the
    input's own). The formats /translate_file takes."""
    if not service.settings.files_translation:
        raise ApiError(403, "Document translation is disabled on this server.")
    started = time.monotonic()
    fields, files = await read_fields(request, max_fields=service.settings.max_form_fields)
    upload = files.get("file")
    if upload is None:
        raise ApiError(400, "Parameter 'file' not specified.")
    if isinstance(fields.get("filename"), str) and fields["filename"]:
        upload = Upload(fields["filename"], upload.data)
    if not upload.filename:
        raise ApiError(400, "Parameter 'filename' not specified: the file's name says its format.")
    key, char_limit = await admit(request, service, auth_key(request, fields))
    target = our_code(fields.get("target_lang"), "target_lang", service.registry)
    source = our_code(fields["source_lang"], "source_lang", service.registry) if fields.get("source_lang") else "auto"
    check_formality(fields.get("formality"))
    refuse_what_is_not_here(fields)
    output_format = fields.get("output_format")
    own_format = documents.extension(upload.filename).lstrip(".")
    if output_format and str(output_format).lower().lstrip(".") != own_format:
        raise ApiError(400, f"Value for 'output_format' not supported: {output_format!r}; a document comes back in "
                       f"its own format ({own_format or 'none'}).")
    file_id, _, characters = await translate_upload(request, service, upload, source, target, None,
                                                    stored_glossaries(fields, source), None, key, char_limit, started)
    await service.count_usage(owner_of(key), characters)
    return {"document_id": file_id[:16], "document_key": file_id[16:]}


async def _document(request: Request, service: Service, document_id: str):
    fields, _ = await read_fields(request, max_fields=service.settings.max_form_fields)
    await admit(request, service, auth_key(request, fields))
    document_key = fields.get("document_key")
    if not isinstance(document_key, str) or not document_key:
        raise ApiError(400, "Parameter 'document_key' not specified.")
    found = await service.files.get(document_id + document_key)
    if found is None:
        raise ApiError(404, f"Document not found: {document_id} with this document_key (documents are kept "
                       f"{service.settings.file_ttl_s:g} s)")
    return found


@router.post("/document/{document_id}", summary="A document's status (DeepL-compatible)",
             responses=errors(400, 403, 404, 429))
async def document_status(document_id: DocumentId, request: Request, service: ServiceDep):
    found = await _document(request, service, document_id)
    return {"document_id": document_id, "status": "done", "billed_characters": found.characters}


@router.post("/document/{document_id}/result", summary="A translated document (DeepL-compatible)",
             responses={**errors(400, 403, 404, 429), 200: {"content": {"application/octet-stream": {}},
                                                             "description": "The translated document."}})
async def document_result(document_id: DocumentId, request: Request, service: ServiceDep):
    found = await _document(request, service, document_id)
    return attachment(found.name, found.data)
