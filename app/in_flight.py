"""The attention that requests in flight hold, within one budget per HTTP process.

A /v1/translate request that keeps attention (include_attention, alignments), or a GET of a
stored alignment, holds up to NMT_MAX_ATTENTION_VALUES of it, as arrays once decoded, as the
lists and then the JSON of its response until its client has read it all; many such requests at
once (or clients that read slowly) would hold that many times as much. So a request reserves its
attention's bound (Service.attention_bounds; a GET the values of the view it asks for) before it
is decoded or read, and is refused with 429 when the reservations
of the requests in flight would pass NMT_ATTENTION_IN_FLIGHT_VALUES (one request alone is always
let through: its own cap is NMT_MAX_ATTENTION_VALUES), and when its client address's requests
would pass their share of it (NMT_CLIENT_SHARE_IN_FLIGHT, a quarter: one client cannot hold what
all others need); what it reserved is released once its response has been sent, or it failed
(`SendAndRelease`, an ASGI middleware around every route).

"Sent" means taken by the client: uvicorn writes a body it is given into the socket's buffer at
once, whatever its size, and returns; only its next write waits for the client to read. So the
middleware hands a large body on in pieces of SEND_PIECE bytes, each waiting until the client
has read the one before (all but the last piece's worth), and a client that takes no piece for
NMT_SEND_TIMEOUT_S is cut off, its connection closed and its reservation released. (Given whole,
40 answers of 15 MB to clients that read nothing, one every 0.75 s, were all written and left
+483 MiB in the server: `bench/slow_readers.py --clients 40 --seconds 40 --interval 0.75`.)
"""

from __future__ import annotations

import asyncio
import logging

from app.errors import ApiError
from app.limits import client_address

log = logging.getLogger("uvicorn.error")
SEND_PIECE = 256 * 1024  # bytes of a response body handed to the server at a time

STATE_KEY = "attention_values"  # in the request's scope["state"]: what it reserved
CLIENT_KEY = "attention_client"  # and for which client address


class AttentionInFlight:
    def __init__(self, budget: int, client_share: float = 1.0, trust_forwarded_for: bool = False):
        """client_share: the part of the budget the requests of one client address may hold
        together (app/limits.py client_address), so that one client cannot take it all."""
        self.budget, self.values = budget, 0
        self.client_budget = max(1, int(budget * client_share))
        self.trust_forwarded_for = trust_forwarded_for
        self.held_by: dict[str, int] = {}  # values reserved, by client address

    def reserve(self, scope: dict, values: int,
                smaller: str = "fewer or shorter texts, fewer hypotheses, a smaller max_length") -> None:
        """Reserve `values` for the request of `scope`, or 429 past the budget or past its
        client's share of it (`smaller`: how the request could ask for less)."""
        client = client_address(scope, self.trust_forwarded_for)
        held = self.held_by.get(client, 0)
        if self.values and self.values + values > self.budget:
            raise ApiError(429, f"too much attention in flight: other requests hold {self.values:,} values and this "
                           f"one could hold {values:,}, of {self.budget:,} together (NMT_ATTENTION_IN_FLIGHT_VALUES); "
                           f"retry shortly, or ask for less ({smaller})")
        if held and held + values > self.client_budget:
            raise ApiError(429, f"too much attention in flight for this client ({client}): its other requests hold "
                           f"{held:,} values and this one could hold {values:,}, of {self.client_budget:,} one client "
                           "may hold (NMT_CLIENT_SHARE_IN_FLIGHT of NMT_ATTENTION_IN_FLIGHT_VALUES); retry once "
                           f"they are answered and read, or ask for less ({smaller})")
        self.values += values
        self.held_by[client] = held + values
        state = scope.setdefault("state", {})
        state[STATE_KEY] = state.get(STATE_KEY, 0) + values
        state[CLIENT_KEY] = client

    def release(self, scope: dict) -> None:
        state = scope.get("state") or {}
        values = state.pop(STATE_KEY, 0)
        if values:
            self.values -= values
            client = state.pop(CLIENT_KEY)
            self.held_by[client] -= values
            if not self.held_by[client]:
                del self.held_by[client]


class SendTimeout(Exception):
    """The client took no part of its response for the send timeout."""


class SendAndRelease:
    """Sends each response body in pieces, as fast as its client reads them, within a stall timeout,
    and releases what the request reserved once the body has gone out (or it failed)."""

    def __init__(self, app, in_flight: AttentionInFlight, send_timeout_s: float = 30.0):
        self.app, self.in_flight, self.send_timeout_s = app, in_flight, send_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})  # one dict the routes below write into, whatever copies the scope

        async def paced(message):
            if message["type"] != "http.response.body" or len(message.get("body", b"")) <= SEND_PIECE:
                return await self._send(send, message)
            body, more = message["body"], message.get("more_body", False)
            for start in range(0, len(body), SEND_PIECE):
                last = start + SEND_PIECE >= len(body)
                await self._send(send, {"type": "http.response.body", "body": body[start:start + SEND_PIECE],
                                        "more_body": more or not last})

        try:
            await self.app(scope, receive, paced)
        except SendTimeout:  # returning with the body unfinished: uvicorn closes the connection
            client = scope.get("client") or ("?",)
            log.warning("%s %s: the client at %s took no part of its response for %g s (NMT_SEND_TIMEOUT_S); "
                        "connection closed", scope.get("method"), scope.get("path"), client[0], self.send_timeout_s)
        finally:
            self.in_flight.release(scope)

    async def _send(self, send, message) -> None:
        try:
            async with asyncio.timeout(self.send_timeout_s):  # a timer, not a task
                await send(message)
        except TimeoutError:
            raise SendTimeout() from None
