"""bench/http_cost.py runs through and prints what it says: a smoke test on the tiny model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_http_cost_bench_prints_a_row_per_request_and_its_profile(tiny_checkpoint, tmp_path):
    profile, data = tmp_path / "v1.prof", tmp_path / "sentences.txt"
    data.write_text("Open the file.\nSave your changes.\nClose the window.\n")  # within the tiny model's positions
    run = subprocess.run([sys.executable, str(ROOT / "bench/http_cost.py"), "--model", str(tiny_checkpoint),
                          "--data", str(data),
                          "--requests", "5", "--idle-ms", "0,1", "--profile", str(profile)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "NMT_DETECT_LANGUAGES": "none"})
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in run.stdout.splitlines()
            if line.startswith("| ") and " | " in line}
    assert rows["POST /v1/translate, refused (400)"][0] == "400"
    for name in ("GET /health", "POST /v1/translate", "POST /translate (LibreTranslate)", "POST /v2/translate (DeepL)"):
        status, *cells = rows[name]
        assert status == "200", (name, rows[name])
        assert len(cells) == 2 and all(float(c.rstrip(" |")) > 0 for c in cells), (name, rows[name])
    assert profile.stat().st_size > 0 and "own time by package" in run.stdout


def test_the_http_cost_bench_with_the_cache_counts_each_rows_lookups(tiny_checkpoint, tmp_path):
    """--cache: a row of one sentence asked again (every timed request a hit), and the lookups of
    every row counted (the tiny model reads the numbers that make texts unique as one unknown
    piece, so its other rows hit too; with a real model they miss, as BENCHMARKS.md shows)."""
    data = tmp_path / "sentences.txt"
    data.write_text("Open the file.\nSave your changes.\nClose the window.\n")
    run = subprocess.run([sys.executable, str(ROOT / "bench/http_cost.py"), "--model", str(tiny_checkpoint),
                          "--data", str(data), "--requests", "3", "--idle-ms", "0", "--cache"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "NMT_DETECT_LANGUAGES": "none"})
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split(" | ")[0].lstrip("| "): [c.rstrip(" |") for c in line.split(" | ")[1:]]
            for line in run.stdout.splitlines() if line.startswith("| ") and " | " in line}
    assert rows["POST /v1/translate, one sentence again and again (a cache hit)"][::2] == ["200", "3 / 3"]
    assert rows["GET /health"][2] == "0 / 0" and rows["POST /v1/translate, refused (400)"][2] == "0 / 0"
    assert rows["POST /v1/translate"][2].endswith(" / 3")
    assert rows["POST /v1/translate, 32 texts, max_length 2"][0] == "200"
    assert rows["POST /v1/translate, 32 texts, max_length 2"][2].endswith(" / 96")  # 32 lookups a request
