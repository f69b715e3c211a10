"""Screenshot of the attention viewer for the README.

Starts the service on a free local port with one checkpoint, translates a sample sentence in
the page (headless Debian Chromium driven by Playwright), and saves a 1280x800 PNG.

    python scripts/screenshot.py                          # checkpoints/en-de -> docs/viewer.png
    python scripts/screenshot.py --model /tmp/tiny/ckpt --out /tmp/viewer.png --phone /tmp/viewer-phone.png

Needs `pip install playwright` and `apt-get install chromium` (Playwright's own browser
download is not used).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SAMPLE = "Open the file and save your changes."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, port: int, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, NMT_MODEL_DIRS=str(model), NMT_WORKERS="1", NMT_MAX_WAIT_MS="1")
    env.setdefault("NMT_DEVICE", "cpu")
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port",
                                 str(port), "--log-level", "warning"], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)


def wait_ready(proc: subprocess.Popen, base: str, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            sys.exit(f"the server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"the server was not ready within {timeout:g} s:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.25)


def translate_in_page(page, base: str, text: str, n_best: int) -> None:
    page.goto(base + "/")
    page.wait_for_selector("body[data-ready=true]")
    page.fill("#source-text", text)
    page.fill("#n-best", str(n_best))
    page.click("#translate-button")
    page.wait_for_function("window.viewerState.version > 0 && !window.viewerState.busy")
    error = page.locator("#error")
    if error.is_visible():
        sys.exit(f"the page shows an error: {error.inner_text()}")


def point_at_a_link(page) -> None:
    """Hover the hard-aligned cell of the second target token, to show the highlight."""
    pairs = page.evaluate("window.viewerState.hardAlignment").split()
    if not pairs:
        return
    source, target = pairs[min(1, len(pairs) - 1)].split("-")
    page.hover(f"#heatmap rect[data-row='{target}'][data-col='{source}']")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "en-de", help="checkpoint directory")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "viewer.png", help="PNG to write (1280x800)")
    ap.add_argument("--phone", type=Path, help="also write a full-page PNG at phone width (390 px) here")
    ap.add_argument("--text", default=SAMPLE, help="sentence to translate")
    ap.add_argument("--n-best", type=int, default=3)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for the server")
    args = ap.parse_args(argv)

    if not args.model.is_dir():
        sys.exit(f"{args.model}: no such checkpoint directory (use --model)")
    if not Path(args.chromium).is_file():
        sys.exit(f"{args.chromium}: Chromium not found (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit("playwright is missing: pip install playwright")

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="nmt-screenshot-")) / "server.log"
    proc = start_server(args.model.resolve(), port, log_path)
    try:
        wait_ready(proc, base, log_path, args.timeout)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            translate_in_page(page, base, args.text, args.n_best)
            point_at_a_link(page)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out))
            print(f"wrote {args.out}")
            if args.phone:
                phone = browser.new_page(viewport={"width": 390, "height": 844})
                translate_in_page(phone, base, args.text, args.n_best)
                args.phone.parent.mkdir(parents=True, exist_ok=True)
                phone.screenshot(path=str(args.phone), full_page=True)
                print(f"wrote {args.phone}")
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
