"""One error shape everywhere, LibreTranslate's: {"error": "<message>"}.

Bad input is 400 (LibreTranslate's code; FastAPI's 422 is replaced), with a message naming the
field, the problem and what is allowed.
"""

from __future__ import annotations

import logging
import sys

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from app.markup import TooDeep
from app.storage import QuotaExceeded, StorageUnavailable

log = logging.getLogger("uvicorn.error")


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def error_response(status: int, message: str, headers: dict | None = None, path: str = "") -> JSONResponse:
    """The one error shape, {"error": ...}; DeepL's {"message": ...} under /v2/ (app/routers/deepl.py)."""
    # a message quoting the input may quote a lone surrogate, which UTF-8 cannot encode: escape it
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    field = "message" if path.startswith("/v2/") else "error"
    return JSONResponse({field: message}, status_code=status, headers=headers)


def _shorten(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_TYPE_TAGS = {"str", "int", "float", "bool", "none"}


def malformed_json(reason: str) -> str:
    """The 400's text for a body json cannot parse, in the client's terms (CPython's limit on an
    integer's digits names the interpreter's setting instead)."""
    if "integer string conversion" in reason:
        reason = f"a number has more than {sys.get_int_max_str_digits():,} digits"
    return f"malformed JSON: {reason}"


def describe_validation(errors: list[dict], known_fields: list[str] | None = None) -> str:
    """pydantic errors as one line, 'field: problem (got value)' joined by '; '. A union's branches
    (str | list[str]) are merged into one 'or', and a branch that failed deeper (text.1 in a
    list) stands for the union."""
    problems: dict[str, list[str]] = {}
    got: dict[str, str] = {}
    for e in errors:
        kind, message = e.get("type", ""), e.get("msg", "invalid")
        if kind == "json_invalid":
            return malformed_json(str(e.get('ctx', {}).get('error', message)))
        loc = [str(x) for x in e.get("loc", ()) if x != "body" and str(x) not in _TYPE_TAGS and "[" not in str(x)]
        field = ".".join(loc) or ("" if kind == "value_error" else "body")  # a model validator names its fields
        if kind == "missing":
            message = "required"
        elif kind == "extra_forbidden":
            message = "unknown field" + (f"; allowed: {', '.join(known_fields)}" if known_fields else "")
        elif kind in ("model_type", "model_attributes_type"):
            message = "must be a JSON object"
        elif message.startswith("Value error, "):
            message = message[len("Value error, "):]
        elif "input" in e:
            got[field] = _shorten(e["input"])
        problems.setdefault(field, [])
        if message not in problems[field]:
            problems[field].append(message)
    for field in [f for f in problems if f and any(other.startswith(f + ".") for other in problems)]:
        del problems[field]
    parts = []
    for field, messages in list(problems.items())[:5]:
        text = " or ".join(messages) + (f" (got {got[field]})" if field in got else "")
        parts.append(f"{field}: {text}" if field else text)
    if len(problems) > 5:
        parts.append(f"and {len(problems) - 5} more")
    return "; ".join(parts)


def body_fields(request: Request) -> list[str] | None:
    """The fields of the JSON body model of the route the request matched, if it has one."""
    dependant = getattr(request.scope.get("route"), "dependant", None)
    for param in getattr(dependant, "body_params", []):
        model = param.field_info.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            return sorted(model.model_fields)
    return None


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.headers, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return error_response(400, describe_validation(list(exc.errors()), body_fields(request)),
                              path=request.url.path)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}; see /docs"
        elif exc.status_code == 400 and isinstance(exc.__cause__, ValueError):  # FastAPI's "error parsing the body"
            message = malformed_json(str(exc.__cause__))
        return error_response(exc.status_code, message, getattr(exc, "headers", None), request.url.path)

    @app.exception_handler(TooDeep)
    async def too_deep(request: Request, exc: TooDeep):
        return error_response(400, str(exc), path=request.url.path)

    @app.exception_handler(QuotaExceeded)
    async def quota_exceeded(request: Request, exc: QuotaExceeded):
        return error_response(429, str(exc), path=request.url.path)

    @app.exception_handler(StorageUnavailable)
    async def storage_unavailable(request: Request, exc: StorageUnavailable):
        log.warning("%s %s: %s", request.method, request.url.path, exc.detail)
        return error_response(503, "this needs the shared store, which is unavailable; translation without it still "
                              "works (alignments, files and keys in Redis do not)")

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect):  # while its body was read: nobody to answer
        log.info("%s %s: the client went away before its request body arrived", request.method, request.url.path)
        return error_response(499, "the client closed the connection before sending its whole request")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error")
