"""The attention that requests in flight hold, within one budget per HTTP process.

A /v1/translate request that keeps attention (include_attention, alignments) holds up to
NMT_MAX_ATTENTION_VALUES of it, as arrays once decoded, as the lists and then the JSON of its
response until its client has read it all; many such requests at once (or clients that read
slowly) would hold that many times as much. So a request reserves its attention's bound
(Service.attention_bounds) before it is decoded, and is refused with 429 when the reservations
of the requests in flight would pass NMT_ATTENTION_IN_FLIGHT_VALUES (one request alone is always
let through: its own cap is NMT_MAX_ATTENTION_VALUES); what it reserved is released once its
response has been sent, or it failed (`ReleaseAttention`, an ASGI middleware around every route).
"""

from __future__ import annotations

from app.errors import ApiError

STATE_KEY = "attention_values"  # in the request's scope["state"]: what it reserved


class AttentionInFlight:
    def __init__(self, budget: int):
        self.budget, self.values = budget, 0

    def reserve(self, scope: dict, values: int) -> None:
        """Reserve `values` for the request of `scope`, or 429 past the budget."""
        if self.values and self.values + values > self.budget:
            raise ApiError(429, f"too much attention in flight: other requests hold {self.values:,} values and this "
                           f"one could hold {values:,}, of {self.budget:,} together (NMT_ATTENTION_IN_FLIGHT_VALUES); "
                           "retry shortly, or ask for less (fewer or shorter texts, fewer hypotheses, a smaller "
                           "max_length)")
        self.values += values
        state = scope.setdefault("state", {})
        state[STATE_KEY] = state.get(STATE_KEY, 0) + values

    def release(self, scope: dict) -> None:
        self.values -= (scope.get("state") or {}).pop(STATE_KEY, 0)


class ReleaseAttention:
    """Releases what a request reserved once its response has gone out (or it failed)."""

    def __init__(self, app, in_flight: AttentionInFlight):
        self.app, self.in_flight = app, in_flight

    async def __call__(self, scope, receive, send):
        scope.setdefault("state", {})  # one dict the routes below write into, whatever copies the scope
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight.release(scope)
