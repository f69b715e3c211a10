"""The attention viewer page in a real browser: Debian's Chromium driven by Playwright, against a
live uvicorn serving a tiny random checkpoint.

Nothing here is skipped: without Chromium (apt-get install chromium) or the playwright package
the tests fail and say what to install.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = os.environ.get("NMT_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SENTENCE = "Open the file and save your changes."
WAIT_MS = 15_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    """Base URL of a uvicorn running app.main:app on the tiny checkpoint."""
    port = free_port()
    env = dict(os.environ, NMT_MODEL_DIRS=str(tiny_checkpoint), NMT_DEVICE="cpu", NMT_WORKERS="1",
               NMT_THREADS_PER_WORKER="1", NMT_MAX_WAIT_MS="1")
    log = tmp_path_factory.mktemp("viewer-server") / "uvicorn.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "warning"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server was not ready within 60 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: pip install playwright (the browser itself comes from "
                    "Debian: apt-get install chromium)")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        found = shutil.which("chromium")
        pytest.fail(f"Chromium is not at {CHROMIUM}{f' (there is one at {found}: set NMT_TEST_CHROMIUM)' if found else ''}; "
                    "install it with: apt-get install -y chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def open_viewer(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")


def translate(page, text: str = SENTENCE, beam: int = 4, n_best: int = 3) -> str:
    """Translate through the form; returns the alignment id the page shows."""
    before = page.evaluate("window.viewerState.version")
    page.fill("#source-text", text)
    page.fill("#beam-size", str(beam))
    page.fill("#n-best", str(n_best))
    page.click("#translate-button")
    page.wait_for_function("v => window.viewerState.version > v && !window.viewerState.busy", arg=before)
    return page.evaluate("window.viewerState.alignmentId")


def drawn_weights(page) -> list[list[float]]:
    """The weights of the SVG cells, as rows."""
    cells = page.eval_on_selector_all(
        "#heatmap rect[data-row][data-col]",
        "rs => rs.map(r => [+r.dataset.row, +r.dataset.col, +r.dataset.weight])")
    rows = max(r for r, _, _ in cells) + 1
    cols = max(c for _, c, _ in cells) + 1
    out = [[None] * cols for _ in range(rows)]
    for r, c, w in cells:
        out[r][c] = w
    return out


def select_view(page, layer="mean", head="mean") -> None:
    before = page.evaluate("window.viewerState.version")
    page.select_option("#layer-select", str(layer))
    page.select_option("#head-select", str(head))
    page.wait_for_function("v => window.viewerState.version > v", arg=before)


def close(a, b, tol=2e-4) -> bool:
    return all(abs(x - y) <= tol for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_translate_draws_labelled_heatmap_and_alternatives(server, page):
    open_viewer(page, server + "/")
    assert page.eval_on_selector_all("#pair-select option", "os => os.map(o => o.value)") == ["en-de"]
    alignment_id = translate(page, n_best=3)
    assert page.url.endswith(f"/?alignment={alignment_id}"), page.url

    stored = httpx.get(f"{server}/v1/alignments/{alignment_id}").json()
    rows, cols = len(stored["target_tokens"]), len(stored["source_tokens"])
    assert page.locator("#heatmap rect[data-row][data-col]").count() == rows * cols
    assert page.get_attribute("#heatmap", "data-rows") == str(rows)
    assert page.get_attribute("#heatmap", "data-cols") == str(cols)
    assert page.locator("#heatmap text.row-label").count() == rows
    assert page.locator("#heatmap text.col-label").count() == cols
    assert page.evaluate("window.viewerState.sourceTokens") == stored["source_tokens"]
    assert page.evaluate("window.viewerState.targetTokens") == stored["target_tokens"]
    assert page.locator("#legend svg").count() == 1

    # the translation and its two alternatives, each with a score; the best is selected
    hyps = page.locator("#result-list .hypothesis")
    assert hyps.count() == 3
    assert page.inner_text("#result-list .hypothesis.translation .hyp-text").strip()
    assert page.get_attribute("#result-list .hypothesis.translation", "aria-pressed") == "true"
    for i in range(3):
        float(hyps.nth(i).locator(".hyp-score").get_attribute("data-score"))

    # clicking an alternative shows its attention and makes it the permalink
    alt = hyps.nth(1)
    alt_id = alt.get_attribute("data-alignment-id")
    assert alt_id and alt_id != alignment_id
    alt.click()
    page.wait_for_function("id => window.viewerState.alignmentId === id && !window.viewerState.busy", arg=alt_id)
    assert alt.get_attribute("aria-pressed") == "true"
    assert page.url.endswith(f"/?alignment={alt_id}")
    alt_stored = httpx.get(f"{server}/v1/alignments/{alt_id}").json()
    assert page.evaluate("window.viewerState.targetTokens") == alt_stored["target_tokens"]

    ARTIFACTS.mkdir(exist_ok=True)
    page.hover("#heatmap rect[data-row='1'][data-col='1']")
    page.screenshot(path=str(ARTIFACTS / "viewer-test.png"), full_page=True)


def test_layer_and_head_selection_match_the_api(server, page):
    open_viewer(page, server + "/")
    alignment_id = translate(page, n_best=1)
    full = httpx.get(f"{server}/v1/alignments/{alignment_id}").json()["attention"]

    select_view(page, layer=0, head=0)
    head0 = drawn_weights(page)
    assert close(head0, full[0][0])
    select_view(page, layer=0, head=1)
    head1 = drawn_weights(page)
    assert close(head1, full[0][1])
    assert not close(head0, head1, tol=1e-6), "switching the head did not change the drawn values"

    # means are computed in the page; they must agree with the service's own reduction
    for layer, head in (("mean", "mean"), (1, "mean"), ("mean", 2)):
        select_view(page, layer=layer, head=head)
        reduced = httpx.get(f"{server}/v1/alignments/{alignment_id}", params={"layer": layer, "head": head}).json()
        assert close(drawn_weights(page), reduced["attention"][0][0]), (layer, head)
        assert close(page.evaluate("window.viewerState.matrix"), reduced["attention"][0][0])

    # the thumbnail grid: one per head plus the mean; clicking one selects that head
    select_view(page, layer=1, head="mean")
    heads = page.evaluate("window.viewerState.heads")
    assert page.locator("#head-grid button[data-head]").count() == heads + 1
    page.click("#head-grid button[data-head='3']")
    page.wait_for_function("window.viewerState.head === 3")
    assert page.input_value("#head-select") == "3"
    assert page.get_attribute("#head-grid button[data-head='3']", "aria-pressed") == "true"
    assert close(drawn_weights(page), full[1][3])
    assert "layer=1" in page.url and "head=3" in page.url


def test_hover_and_keyboard_highlight_tokens(server, page):
    open_viewer(page, server + "/")
    translate(page, n_best=1)
    page.hover("#heatmap rect[data-row='2'][data-col='1']")
    assert page.get_attribute("#heatmap text.row-label[data-row='2']", "class").split().count("active") == 1
    assert "active" in page.get_attribute("#heatmap text.col-label[data-col='1']", "class")
    weight = float(page.get_attribute("#heatmap rect[data-row='2'][data-col='1']", "data-weight"))
    assert f"{weight:.3f}" in page.inner_text("#cell-readout")
    assert "active" in page.get_attribute("#links g[data-side='source'][data-index='1']", "class")
    assert "active" in page.get_attribute("#links g[data-side='target'][data-index='2']", "class")

    page.mouse.move(5, 5)
    page.focus("#heatmap")
    assert page.get_attribute("#heatmap", "data-cursor-row") == "0"
    for key in ("ArrowRight", "ArrowRight", "ArrowDown", "End", "ArrowLeft"):
        page.keyboard.press(key)
    cols = int(page.get_attribute("#heatmap", "data-cols"))
    assert page.get_attribute("#heatmap", "data-cursor-row") == "1"
    assert page.get_attribute("#heatmap", "data-cursor-col") == str(cols - 2)
    assert "active" in page.get_attribute(f"#heatmap text.col-label[data-col='{cols - 2}']", "class")
    assert "(row 1)" in page.inner_text("#cell-readout")


def test_permalink_reloads_the_same_matrix(server, page, browser):
    open_viewer(page, server + "/")
    translate(page, n_best=1)
    select_view(page, layer=1, head=2)
    matrix = page.evaluate("window.viewerState.matrix")
    url = page.url
    assert "?alignment=" in url and page.get_attribute("#permalink", "href") == url

    other = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        open_viewer(other, url)
        other.wait_for_function("window.viewerState.version > 0")
        assert other.evaluate("window.viewerState.matrix") == matrix
        assert drawn_weights(other) == drawn_weights(page)
        assert other.input_value("#layer-select") == "1" and other.input_value("#head-select") == "2"
        assert other.inner_text("#result-list .hypothesis .hyp-text").strip()  # what the link holds, in words
    finally:
        other.close()


def test_word_granularity_hard_alignment_and_exports(server, page):
    open_viewer(page, server + "/")
    alignment_id = translate(page, n_best=1)
    before = page.evaluate("window.viewerState.version")
    page.click("label:has(#granularity-word)")
    page.wait_for_function("v => window.viewerState.version > v && window.viewerState.granularity === 'word'",
                           arg=before)
    words = httpx.get(f"{server}/v1/alignments/{alignment_id}",
                      params={"granularity": "word", "layer": "mean", "head": "mean", "hard": "true"}).json()
    assert page.evaluate("window.viewerState.sourceTokens") == words["source_tokens"]
    assert page.locator("#heatmap rect[data-row]").count() == len(words["source_tokens"]) * len(words["target_tokens"])
    # lines between the sentences: one per target word but </s>, the same pairs as the service's
    links = sum(t != "</s>" for t in words["target_tokens"])
    assert page.locator("#links line[data-source][data-target]").count() == links
    assert page.inner_text("#pharaoh-text") == words["hard_alignment"]
    assert "granularity=word" in page.url

    # copy: the clipboard refused, the text shows in a visible box instead
    page.evaluate("() => { navigator.clipboard.writeText = () => Promise.reject(new Error('denied')); }")
    page.click("#copy-pharaoh")
    page.wait_for_selector("#copy-fallback", state="visible")
    assert page.input_value("#copy-fallback-text") == words["hard_alignment"]

    with page.expect_download() as download:
        page.click("#download-json")
    assert download.value.suggested_filename == f"alignment-{alignment_id}-word.json"
    data = json.loads(Path(download.value.path()).read_text())
    assert data["id"] == alignment_id and data["granularity"] == "word"
    assert data["view"]["hard_alignment"] == words["hard_alignment"]
    assert len(data["attention"]) == page.evaluate("window.viewerState.layers")


def test_errors_are_shown_in_words(server, page):
    open_viewer(page, server + "/?alignment=no-such-alignment")
    alert = page.locator("[role=alert]")
    alert.wait_for(state="visible")
    assert "no-such-alignment" in alert.inner_text() and "expired" in alert.inner_text()

    open_viewer(page, server + "/")
    assert not alert.is_visible()
    page.fill("#source-text", "word " * 400)
    page.click("#translate-button")
    alert.wait_for(state="visible")
    assert "at most" in alert.inner_text(), alert.inner_text()

    translate(page, n_best=1)  # a good request clears the message
    assert not alert.is_visible()


def test_phone_width_layout(server, browser):
    page = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
    try:
        open_viewer(page, server + "/")
        translate(page, text=SENTENCE + " " + SENTENCE, n_best=1)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow}px wider than a phone screen"
        scroller = page.evaluate("(() => { const s = document.querySelector('.heatmap-scroll');"
                                 " return [s.scrollWidth, s.clientWidth]; })()")
        assert scroller[1] <= 390
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "viewer-test-phone.png"))
    finally:
        page.close()
