"""GET /v1/alignments/{id}: a stored translation's attention, whole or reduced."""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response

from app.alignments import hard_alignment, rounded_array, select, to_words
from app.errors import ApiError
from app.forms import query_once
from app.protocol import AlignmentResponse
from app.routers import ServiceDep, errors, json_response

router = APIRouter(tags=["alignments"])

Selection = int | Literal["mean"] | None


def _check(name: str, choice: Selection, size: int) -> None:
    if isinstance(choice, int) and not 0 <= choice < size:
        raise ApiError(400, f"{name}: {choice} is out of range; allowed: 0 to {size - 1}, or 'mean'")


@router.get("/v1/alignments/{alignment_id}", response_model=AlignmentResponse, dependencies=[Depends(query_once)],
            responses=errors(400, 403, 404, 429, 503), summary="Attention of a translation stored with alignments=true")
async def get_alignment(
    request: Request,
    service: ServiceDep,
    alignment_id: str = Path(description="The alignment_id of a translation or alternative.", max_length=64,
                             examples=["0b7c3e5f2a9d4c1e8f6a2b4d6c8e0f1a"]),
    layer: Selection = Query(None, description="A layer index, or 'mean' over layers; default all layers.",
                             examples=["mean"]),
    head: Selection = Query(None, description="A head index, or 'mean' over heads; default all heads.",
                            examples=["mean"]),
    granularity: Literal["subword", "word"] = Query("subword", description="'word' merges SentencePiece "
                                                    "pieces into words (rows still sum to 1).", examples=["word"]),
    hard: bool = Query(False, description="Include Pharaoh 'source-target' pairs.", examples=[True]),
    x_api_key: str | None = Header(None, description="API key, where the server requires one.", examples=["my-key"]),
):
    # counted against the caller's rate limit; the id itself is the capability (as /download_file's)
    await service.admit(request, x_api_key, key_required=False)
    stored = await service.alignments.get(alignment_id)
    if stored is None:
        raise ApiError(404, f"no alignment {alignment_id!r}: unknown or expired "
                       f"(alignments live {service.settings.alignment_ttl_s:g} s)")
    layers, heads = stored.attention.shape[:2]
    _check("layer", layer, layers)
    _check("head", head, heads)
    # what the answer holds until its client has read it, within the attention in flight (app/in_flight.py)
    values = stored.attention[0, 0].size * (layers if layer is None else 1) * (heads if head is None else 1)
    service.attention_in_flight.reserve(request.scope, values, smaller="layer=mean or head=mean, or one of each")

    def view() -> Response:  # the reductions and the JSON, off the event loop
        attention = select(select(stored.attention, 0, layer), 1, head)
        source_tokens, target_tokens = stored.source_tokens, stored.target_tokens
        if granularity == "word":
            source_tokens, target_tokens, attention = to_words(source_tokens, target_tokens, attention)
        response = AlignmentResponse(
            id=alignment_id, model=stored.model, source_tokens=source_tokens, target_tokens=target_tokens,
            layers=layers, heads=heads, granularity=granularity, layer=layer, head=head,
            attention=[], hard_alignment=hard_alignment(source_tokens, target_tokens, attention) if hard else None)
        content = response.model_dump(mode="json")
        content["attention"] = rounded_array(attention)  # written from the array
        return json_response(content)

    return await asyncio.to_thread(view)
