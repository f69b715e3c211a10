"""LibreTranslate's request bodies, read strictly: JSON, URL-encoded or multipart form data, with
the query parameters underneath (a body field wins).

Text that is not valid UTF-8 is a 400 naming the field, never replacement characters or Latin-1
guesses (what a lenient parser would hand the model). A multipart body is parsed as it streams
in; an uploaded file is kept in memory, which the body cap bounds (app/body_limit.py).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from urllib.parse import parse_qsl

from python_multipart import create_form_parser
from python_multipart.multipart import Field, File
from starlette.requests import Request

from app.errors import ApiError, malformed_json

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


@dataclass
class Upload:
    """A file of a multipart body."""

    filename: str
    data: bytes


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"{what} is not valid UTF-8 (byte 0x{raw[e.start]:02X} at offset {e.start}): "
                       "send UTF-8 text") from None


def _add(fields: dict, name: str, value: str) -> None:
    """A repeated field (q=a&q=b) becomes a list."""
    if name in fields and isinstance(fields[name], list):
        fields[name].append(value)
    elif name in fields:
        fields[name] = [fields[name], value]
    else:
        fields[name] = value


async def query_once(request: Request) -> None:
    """A dependency of routes whose query parameters each take one value: a 400 naming a
    parameter given more than once (?layer=0&layer=1), which would otherwise take its last value
    silently."""
    counts = Counter(name for name, _ in request.query_params.multi_items())
    repeated = [f"{name!r} {n} times" for name, n in counts.items() if n > 1]
    if repeated:
        raise ApiError(400, f"a query parameter given more than once: {', '.join(repeated)}; each takes one value")


def _too_many_fields(max_fields: int) -> ApiError:
    return ApiError(400, f"the form has more than {max_fields:,} fields (NMT_MAX_FORM_FIELDS)")


async def read_fields(request: Request, required: list[str] = (), max_fields: int = 1000) \
        -> tuple[dict, dict[str, Upload]]:
    """(fields, uploaded files by field name). For JSON the fields are the body object as parsed
    (its shape was checked as it arrived: app/body_limit.py); for forms, strings (a list for a
    repeated field), at most `max_fields` of them with the files and the query's. `required`
    names the fields a 400 for a body of the wrong shape lists."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            fields = json.loads(await request.body())
        except UnicodeDecodeError as e:
            raise ApiError(400, f"the JSON body is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        except ValueError as e:
            raise ApiError(400, malformed_json(str(e))) from None
        if not isinstance(fields, dict):
            raise ApiError(400, "the JSON body must be an object" + (f" with {', '.join(required)}" if required else ""))
        query: dict = {}
        for name, value in request.query_params.multi_items():
            _add(query, name, value)
        return {**query, **fields}, {}
    if content_type and content_type not in FORM_TYPES:
        raise ApiError(400, f"unsupported content type {content_type!r}; send application/json or form data")
    fields: dict = {}
    query = request.query_params.multi_items()
    if len(query) > max_fields:
        raise _too_many_fields(max_fields)
    for name, value in query:
        _add(fields, name, value)
    query_names = set(fields)
    form: dict = {}
    files: dict[str, Upload] = {}
    if content_type == "multipart/form-data":
        await _read_multipart(request, form, files, max_fields - len(query))
    elif content_type:
        body = await request.body()
        try:  # raw UTF-8 is fine (curl -d sends it so), and so is percent-encoded UTF-8
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, encoding="utf-8", errors="strict",
                              max_num_fields=max_fields - len(query))
        except UnicodeDecodeError:
            raise ApiError(400, "the form body is not valid UTF-8 (raw or percent-encoded): send UTF-8") from None
        except ValueError:  # parse_qsl's "Max number of fields exceeded"
            raise _too_many_fields(max_fields) from None
        for name, value in pairs:
            _add(form, name, value)
    for name in query_names & set(form):
        del fields[name]
    for name, value in form.items():
        fields[name] = value
    return fields, files


class _TooManyParts(Exception):
    pass


async def _read_multipart(request: Request, form: dict, files: dict[str, Upload], max_parts: int) -> None:
    failures: list[ApiError] = []
    parts = 0

    def count() -> None:
        nonlocal parts
        parts += 1
        if parts > max_parts:
            raise _TooManyParts

    def on_field(field: Field) -> None:
        count()
        try:
            name = _text(field.field_name or b"", "a form field name")
            _add(form, name, _text(field.value or b"", f"form field {name!r}"))
        except ApiError as e:
            failures.append(e)

    def on_file(file: File) -> None:
        count()
        file.file_object.seek(0)
        name = (file.field_name or b"").decode("utf-8", "replace")
        filename = (file.file_name or b"").decode("utf-8", "replace")
        files[name] = Upload(filename, file.file_object.read())
        file.close()

    headers = {"Content-Type": request.headers.get("content-type", "").encode("latin-1")}
    try:
        parser = create_form_parser(headers, on_field, on_file, config={"MAX_MEMORY_FILE_SIZE": 2**62})
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except _TooManyParts:
        raise _too_many_fields(max_parts) from None
    except ValueError as e:  # python_multipart's FormParserError and friends, a missing boundary
        raise ApiError(400, f"malformed multipart body: {e}") from None
    if failures:
        raise failures[0]
