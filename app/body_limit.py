"""A cap on request bodies, enforced while they are read.

A body declared larger than the cap (Content-Length) is refused with a 413 before a byte of it is
read; one sent without a length (chunked) is counted as it arrives and refused as soon as it
passes the cap. No request makes the server hold more than the cap, however large it is.
File uploads (POST /translate_file) have their own, larger cap.
"""

from __future__ import annotations

from fastapi import HTTPException

from app.errors import error_response


def _too_large(limit: int, setting: str) -> str:
    return f"request body larger than {limit:,} bytes ({setting}): send less per request"


class BodyLimit:
    """ASGI middleware: bodies of requests to `file_paths` may hold `max_file_bytes`, others
    `max_bytes`."""

    def __init__(self, app, max_bytes: int, max_file_bytes: int, file_paths: tuple[str, ...] = ("/translate_file",)):
        self.app, self.max_bytes, self.max_file_bytes, self.file_paths = app, max_bytes, max_file_bytes, file_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] in self.file_paths:
            limit, setting = self.max_file_bytes, "NMT_MAX_FILE_BYTES"
        else:
            limit, setting = self.max_bytes, "NMT_MAX_BODY_BYTES"
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await error_response(413, _too_large(limit, setting))(scope, receive, send)
        received = 0

        async def receive_within_limit():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # raised inside the route's body read: the error handlers answer it (app/errors.py)
                    raise HTTPException(413, _too_large(limit, setting))
            return message

        await self.app(scope, receive_within_limit, send)
