"""`nmt serve`: run the service under uvicorn."""

from __future__ import annotations

import uvicorn

from app.main import create_app
from app.settings import Settings


def serve(host: str | None, port: int | None, model_dirs: list[str] | None) -> None:
    """Serve model_dirs on host:port (None: NMT_MODEL_DIRS, NMT_HOST, NMT_PORT).
    SIGTERM / Ctrl-C stop accepting, finish in-flight requests, then stop the workers."""
    settings = Settings()
    if model_dirs:
        settings = settings.model_copy(update={"model_dirs": list(model_dirs)})
    # proxy_headers off: uvicorn would otherwise take X-Forwarded-For from any loopback peer as the
    # client's address, whatever NMT_TRUST_FORWARDED_FOR says; the service reads it itself when told to
    uvicorn.run(create_app(settings), host=host or settings.host, port=port or settings.port, log_level="info",
                proxy_headers=False, timeout_graceful_shutdown=int(settings.shutdown_timeout_s) or None)
