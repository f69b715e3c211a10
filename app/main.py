"""The ASGI app: `app.main:app` (settings from the environment, made when first asked for), or
`create_app(settings)`."""

from __future__ import annotations

import gc
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app import errors, ui
from app.body_limit import BodyLimit
from app.in_flight import SendAndRelease
from app.metrics import MetricsMiddleware
from app.routers import alignments, deepl, files, health, libretranslate, models, translate
from app.service import Service
from app.settings import Settings

DESCRIPTION = """Neural machine translation with dynamic cross-request batching.

* `/v1/*`: the native API (n-best, alignments, attention).
* `/translate`, `/detect`, `/languages`, `/translate_file`, `/download_file`, `/frontend/settings`, `/suggest`,
  `/spec`: LibreTranslate-compatible.
* `/v2/*`: DeepL-compatible (translate, languages, usage, glossaries), with `Authorization: DeepL-Auth-Key <key>`.
* Every error is `{"error": "<message>"}`; under `/v2/`, DeepL's `{"message": "<message>"}`.
* `/`: the attention viewer.
"""


def _openapi_without_422(app: FastAPI):
    """Bad input answers 400 in the one error shape, so FastAPI's 422 entries would be untrue."""
    build = app.openapi

    def openapi():
        schema = build()
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        return schema

    return openapi


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    service = Service(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        # what is loaded by now (modules, models, tokenizers: ~75,000 objects) lives as long as the
        # server; frozen, the collector stops walking it on every full collection (~50-180 ms each,
        # which every request in flight waited for)
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()  # a process that makes apps again (tests) collects what this one left
            await service.stop()

    app = FastAPI(title="NMT service", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    app.state.service = service
    errors.install(app)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["*"])
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, max_file_bytes=settings.max_file_bytes,
                       max_json_depth=settings.max_json_depth, max_json_values=settings.max_json_values,
                       read_timeout_s=settings.read_timeout_s, max_in_flight_bytes=settings.body_bytes_in_flight,
                       client_share=settings.client_share_in_flight, trust_forwarded_for=settings.trust_forwarded_for)
    app.add_middleware(MetricsMiddleware, metrics=service.metrics)
    app.add_middleware(SendAndRelease, in_flight=service.attention_in_flight,
                       send_timeout_s=settings.send_timeout_s)  # outermost: after the response
    for module in (translate, alignments, models, libretranslate, files, deepl, health):
        app.include_router(module.router)
    app.include_router(ui.router)  # the attention viewer: / and /static/* (app/ui.py)
    app.openapi = _openapi_without_422(app)
    return app


def __getattr__(name: str):
    """`app.main:app`: made on first use, so that importing this module (`nmt serve`, its HTTP
    processes, which call create_app themselves) builds no service."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = globals()["app"] = create_app()
    return made
