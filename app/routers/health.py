"""GET /health (the process answers), /ready (it can translate), /metrics (Prometheus)."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from app.protocol import Health, Ready, WorkerStatus
from app.routers import ServiceDep
from app.storage import StorageUnavailable

log = logging.getLogger("uvicorn.error")

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, summary="Liveness")
async def health():
    return Health(status="ok")


@router.get("/ready", response_model=Ready, responses={503: {"model": Ready, "description": "Not ready, and why."}},
            summary="Readiness: models loaded and every worker alive")
async def ready(service: ServiceDep):
    ok, reason = service.ready()
    workers = [WorkerStatus(index=w.index, device=w.device, state=w.state, restarts=w.restarts, batches=w.batches,
                            busy_seconds=w.busy_seconds, cancelled=w.cancelled, reason=w.reason or None)
               for w in service.workers()]
    models = sorted(service.registry.models) if service.registry else []
    try:
        await service.storage.check()
        storage = "ok"
    except StorageUnavailable as e:  # translation still works: ready stays true, and this says what does not
        log.warning("ready: %s", e.detail)
        storage = str(e)
    body = Ready(ready=ok, reason=reason or None, models=models, workers=workers, storage=storage)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."}})
async def metrics(service: ServiceDep):
    return PlainTextResponse(service.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
