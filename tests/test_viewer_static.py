"""The viewer's files and routes, without a browser or a model: the page is served at / (also
with ?alignment=), its assets with the right types, nothing leaves app/static, and nothing is
loaded from another host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app import ui

STATIC = Path(ui.__file__).parent / "static"


@pytest.fixture(scope="module")
def client():
    app = FastAPI()
    app.include_router(ui.router)
    return TestClient(app)


def test_page_is_served_at_root_and_for_permalinks(client):
    for url in ("/", "/?alignment=0123abcd", "/?alignment=x&granularity=word&layer=1&head=mean"):
        r = client.get(url, follow_redirects=False)
        assert r.status_code == 200, url
        assert r.headers["content-type"].startswith("text/html")
        assert 'id="heatmap"' in r.text and 'role="alert"' in r.text


def test_service_app_serves_the_viewer_at_root():
    from app.main import create_app
    from app.settings import Settings

    client = TestClient(create_app(Settings(model_dirs=["/nonexistent"])))  # no lifespan: nothing loads
    r = client.get("/?alignment=abc", follow_redirects=False)
    assert r.status_code == 200 and 'id="heatmap"' in r.text
    assert client.get("/static/viewer.js").status_code == 200
    assert not any(p == "/" or p.startswith("/static") for p in client.get("/openapi.json").json()["paths"])


@pytest.mark.parametrize("name, media_type", [("viewer.js", "text/javascript"), ("viewer.css", "text/css"),
                                              ("favicon.svg", "image/svg+xml")])
def test_assets_have_their_types(client, name, media_type):
    r = client.get(f"/static/{name}")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith(media_type)


@pytest.mark.parametrize("path", ["/static/../ui.py", "/static/%2e%2e/ui.py", "/static/..%2fui.py",
                                  "/static/nope.js", "/static/", "/static/%00", "/static/viewer.js%00.png",
                                  "/static//etc/passwd"])
def test_nothing_outside_static_is_served(client, path):
    assert client.get(path).status_code == 404


def test_every_module_import_and_asset_exists():
    """Relative imports between the modules, and /static/ references in the page, resolve."""
    for js in STATIC.glob("*.js"):
        for target in re.findall(r'^import .* from "\./([^"]+)";$', js.read_text(), flags=re.M):
            assert (STATIC / target).is_file(), f"{js.name} imports missing {target}"
    html = (STATIC / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="/static/([^"]+)"', html)
    assert {"viewer.js", "viewer.css"} <= set(refs)
    for ref in refs:
        assert (STATIC / ref).is_file(), ref


def test_no_remote_resources():
    """Everything is local: no CDN, no remote fonts or scripts (the SVG namespace is not a fetch)."""
    for f in STATIC.iterdir():
        text = f.read_text()
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", text)) - {"http://www.w3.org/2000/svg"}
        urls = {u for u in urls if not u.startswith("//www.w3.org/2000/svg")}
        assert not urls, f"{f.name} refers to {urls}"


def test_static_is_flat_for_package_data():
    """pyproject ships app/static/* only; a subfolder would be missing from an installed wheel."""
    assert not [p for p in STATIC.iterdir() if p.is_dir()]
