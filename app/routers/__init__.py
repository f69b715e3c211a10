"""One router per resource; this module holds what they share."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import Depends, Request, Response

from app.protocol import ErrorResponse
from app.service import Service

_MEANINGS = {
    400: "Bad input: the message names the field, the problem and what is allowed.",
    403: "API key missing or wrong.",
    404: "Not found, or expired.",
    413: "The request body is larger than the server accepts (NMT_MAX_BODY_BYTES, NMT_MAX_FILE_BYTES), or the "
         "attention asked for could pass NMT_MAX_ATTENTION_VALUES.",
    429: "The client's requests per minute are spent (\"Slowdown: N per 1 minute\", with Retry-After), or too "
         "many items are waiting; retry later.",
    503: "A worker failed on this request, or the server is shutting down; retry.",
    504: "The request's deadline passed.",
    507: "The server's store for what this call keeps is full (NMT_SUGGESTIONS_MAX_BYTES); its operator clears it.",
}


def errors(*codes: int) -> dict:
    """OpenAPI entries for the error responses a route can give (all in the one error shape)."""
    return {code: {"model": ErrorResponse, "description": _MEANINGS[code]} for code in codes}


async def get_service(request: Request) -> Service:
    # async: FastAPI would run a plain function in its thread pool, a thread hop per request
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]



def json_response(content: dict) -> Response:
    """`content` as JSON by orjson, its numpy arrays (attention, as `rounded_array` made them) written
    from the arrays: 1.6 million values take ~0.05 s there, where a Python float each through
    FastAPI's validation and json.dumps held the event loop ~0.7 s."""
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")
