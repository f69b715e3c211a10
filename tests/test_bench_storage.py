"""bench/storage.py runs through and prints its rows: a smoke test at small sizes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_storage_bench_prints_its_rows():
    run = subprocess.run([sys.executable, str(ROOT / "bench/storage.py"), "--budget-mib", "0.05", "--after", "300",
                          "--keys", "50", "--glossary-owners", "1"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in run.stdout.splitlines()
            if line.startswith("| ") and " | " in line}
    assert rows["filling the budget"][0] == f"{int(0.05 * 2**20) // 250:,}"
    assert rows["full: each evicts the least recently used"][0] == "300"
    assert float(rows["is any API key stored (every DeepL call)"][1]) >= 0
    listed = rows["one key's glossaries listed"][1]
    assert listed == "no redis-server" if shutil.which("redis-server") is None else float(listed) >= 0
