"""What a request body may be: its size, and for JSON its shape, enforced while it is read.

A body declared larger than the cap (Content-Length) is refused with a 413 before a byte of it is
read; one sent without a length (chunked) is counted as it arrives and refused as soon as it
passes the cap. No request makes the server hold more than the cap, however large it is. A body
that stops arriving for NMT_READ_TIMEOUT_S is answered 408 and its connection closed (the head's
deadline is the HTTP protocol's: app/serve.py).

The bodies of all the requests in flight in one HTTP process are held within one budget too,
NMT_BODY_BYTES_IN_FLIGHT, counted as their bytes arrive and until each request is answered: many
connections that each send most of a large body and hold back the rest would otherwise hold that
many times the cap (200 of them, each 10 bytes short of 4 MiB, held +740 MiB; a byte now and then
keeps each open). Past the budget a body is refused with 503 once it passes SMALL_BODY bytes, so
the usual small request still goes through while large ones fill the budget; small bodies have a
quarter of the budget more, past which they are refused too (else enough connections each
holding back most of 63 KiB would hold any amount); one request alone always goes through. The
requests of one client address hold at most their share of that (NMT_CLIENT_SHARE_IN_FLIGHT, a
quarter; past it 429 for that client), so that one client cannot fill the budget for the others.
File uploads (POST /translate_file, DeepL's POST /v2/document) have their own, larger cap.

A JSON body is scanned before anything parses it: nesting deeper than NMT_MAX_JSON_DEPTH or more
than NMT_MAX_JSON_VALUES values is a 400. A parser would build a Python object for every value,
~50 bytes each: 4 MiB of `[],[],...` is a million lists, and 100,000 nested arrays exhaust its
recursion. The scan keeps no objects and stops at the first limit passed.
"""

from __future__ import annotations

import asyncio
import re

from fastapi import HTTPException

from app.errors import error_response
from app.limits import client_address

SMALL_BODY = 64 * 1024  # bodies up to this size (most requests) may go past the budget by a quarter

# A JSON string (escapes included; possessive, so a string is read once and never backtracked into),
# an unterminated one (to the end of the body), or one structural character: every token is found
# in time linear in its length, and the scan never starts inside a string it has read.
_JSON_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(")?|[\[\]{},]')


def _too_large(limit: int, setting: str) -> str:
    return f"request body larger than {limit:,} bytes ({setting}): send less per request"


def json_shape_problem(body: bytes, max_depth: int, max_values: int) -> str | None:
    """What is wrong with the shape of a JSON body, or None. Values are counted as the commas
    between them plus one per array or object (an upper bound for valid JSON)."""
    openers = body.count(b"[") + body.count(b"{")
    if openers <= max_depth and openers + body.count(b",") + 1 <= max_values:
        return None  # even counting the brackets and commas inside strings, within both limits
    # Valid JSON within the limits holds at most max_values openers and commas, as many closers,
    # and two strings per value (a key and its value): more tokens than that cannot be within them.
    depth, values, max_tokens = 0, 1, 4 * max_values + 4
    for tokens, token in enumerate(_JSON_TOKEN.finditer(body), start=1):
        c = body[token.start()]
        if c == ord('"'):
            if token.group(1) is None:
                return None  # an unterminated string: not JSON, which the parser says (in linear time)
        elif c in b"[{":
            depth += 1
            values += 1
            if depth > max_depth:
                return (f"the JSON body nests arrays and objects more than {max_depth} deep (NMT_MAX_JSON_DEPTH)")
        elif c in b"]}":
            depth -= 1
            if depth < 0:
                return None  # a closer without its opener: not JSON
        elif c == ord(","):
            values += 1
        if values > max_values or tokens > max_tokens:
            return (f"the JSON body holds more than {max_values:,} values (NMT_MAX_JSON_VALUES): send fewer texts "
                    "or entries per request")
    return None


def _is_json(scope) -> bool:
    content_type = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
    return content_type == b"application/json" or content_type.endswith(b"+json")


class BodyLimit:
    """ASGI middleware: bodies of requests to `file_paths` may hold `max_file_bytes`, others
    `max_bytes`; JSON bodies at most `max_json_depth` levels and `max_json_values` values."""

    def __init__(self, app, max_bytes: int, max_file_bytes: int,
                 file_paths: tuple[str, ...] = ("/translate_file", "/v2/document"),
                 max_json_depth: int = 32, max_json_values: int = 10_000, read_timeout_s: float = 30.0,
                 max_in_flight_bytes: int = 256 * 2**20, client_share: float = 1.0, trust_forwarded_for: bool = False):
        self.app, self.max_bytes, self.max_file_bytes, self.file_paths = app, max_bytes, max_file_bytes, file_paths
        self.max_json_depth, self.max_json_values = max_json_depth, max_json_values
        self.read_timeout_s, self.max_in_flight_bytes = read_timeout_s, max_in_flight_bytes
        self.in_flight_bytes = 0  # body bytes the requests in flight have received
        self.client_in_flight_bytes = max(1, int(max_in_flight_bytes * client_share))
        self.trust_forwarded_for = trust_forwarded_for
        self.held_by: dict[str, int] = {}  # of those, by client address (app/limits.py client_address)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] in self.file_paths:
            limit, setting = self.max_file_bytes, "NMT_MAX_FILE_BYTES"
        else:
            limit, setting = self.max_bytes, "NMT_MAX_BODY_BYTES"
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await error_response(413, _too_large(limit, setting), path=scope["path"])(scope, receive, send)
        received, body_done = 0, False
        client = client_address(scope, self.trust_forwarded_for)
        json_chunks: list[bytes] | None = [] if _is_json(scope) else None

        async def receive_within_limit():
            nonlocal received, body_done
            if body_done:  # after the body, what comes is the client going away, whenever it does
                return await receive()
            try:
                async with asyncio.timeout(self.read_timeout_s):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(408, f"the request body stopped arriving: nothing for {self.read_timeout_s:g} s "
                                    f"after {received:,} bytes (NMT_READ_TIMEOUT_S)", {"Connection": "close"}) from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                small = 1 if received + len(chunk) > SMALL_BODY else 1.25
                held = self.held_by.get(client, 0)
                if self.in_flight_bytes + len(chunk) > self.max_in_flight_bytes * small and received < self.in_flight_bytes:
                    # (others hold some: one alone always passes)
                    raise HTTPException(503, f"the server holds {self.in_flight_bytes:,} bytes of request bodies in "
                                        f"flight, of {self.max_in_flight_bytes:,} (NMT_BODY_BYTES_IN_FLIGHT); retry "
                                        "shortly", {"Retry-After": "1", "Connection": "close"})
                if held + len(chunk) > self.client_in_flight_bytes * small and received < held:
                    raise HTTPException(429, f"this client ({client}) holds {held:,} bytes of request bodies in flight, "
                                        f"of the {self.client_in_flight_bytes:,} one client may hold "
                                        "(NMT_CLIENT_SHARE_IN_FLIGHT of NMT_BODY_BYTES_IN_FLIGHT): finish or "
                                        "close the requests it has open first", {"Retry-After": "1", "Connection": "close"})
                received += len(chunk)
                self.in_flight_bytes += len(chunk)
                self.held_by[client] = held + len(chunk)
                if received > limit:
                    # raised inside the route's body read: the error handlers answer it (app/errors.py)
                    raise HTTPException(413, _too_large(limit, setting))
                if json_chunks is not None:
                    json_chunks.append(chunk)
                    if not message.get("more_body", False):
                        body = json_chunks[0] if len(json_chunks) == 1 else b"".join(json_chunks)
                        args = (body, self.max_json_depth, self.max_json_values)
                        # linear, but a 4 MiB body is ~50 ms of scanning: off the event loop
                        problem = json_shape_problem(*args) if len(body) < 2**16 else \
                            await asyncio.to_thread(json_shape_problem, *args)
                        if problem:
                            raise HTTPException(400, problem)
            return message

        try:
            await self.app(scope, receive_within_limit, send)
        finally:
            self.in_flight_bytes -= received
            if received:
                self.held_by[client] -= received
                if not self.held_by[client]:
                    del self.held_by[client]
