"""The attention viewer page: `/` serves index.html, `/static/<file>` its assets.

Everything is plain files in app/static (HTML, CSS, vanilla JS modules); there is no
build step and nothing is loaded from another host. `/?alignment=<id>` is the same page,
which reads the id from the URL and fetches the stored alignment itself.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

STATIC_DIR = Path(__file__).resolve().parent / "static"

# Explicit types: a module script must come with a JavaScript MIME type, whatever the
# platform's mimetypes table says.
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
}
NO_CACHE = {"Cache-Control": "no-cache"}  # revalidate, so a deploy is picked up at once
# What /static/ serves: the directory's files, looked up by name, so no client path reaches the disk
STATIC_FILES = {p.name: p for p in STATIC_DIR.iterdir() if p.is_file() and p.suffix in MEDIA_TYPES}

router = APIRouter(include_in_schema=False)


@router.get("/")
def index() -> FileResponse:
    """The viewer page (query parameters such as ?alignment=<id> are read by the page's script)."""
    return FileResponse(STATIC_DIR / "index.html", media_type=MEDIA_TYPES[".html"], headers=NO_CACHE)


@router.get("/static/{name:path}")
def static_file(name: str) -> FileResponse:
    path = STATIC_FILES.get(name)
    if path is None:
        raise HTTPException(status_code=404, detail=f"no static file {name[:100]!r}")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=NO_CACHE)
