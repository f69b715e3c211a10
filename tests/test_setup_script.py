"""scripts/setup.sh runs pip only when there is something to install: on a copy of the script
beside a fake .venv whose python records what it is asked to do."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_setup_runs_pip_again_only_for_a_change_or_a_new_extra(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    log = tmp_path / "calls.log"
    python.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    python.chmod(0o755)

    def setup(*extras: str) -> tuple[list[str], str]:
        log.write_text("")
        run = subprocess.run(["bash", "scripts/setup.sh", *extras], cwd=tmp_path, capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr
        return [line for line in log.read_text().splitlines() if line.startswith("-m pip")], run.stderr

    pip, _ = setup()
    assert pip == ["-m pip install -q --upgrade pip", "-m pip install -q torch==2.13.0", "-m pip install -q -e ."]
    pip, said = setup()
    assert pip == [] and "up to date" in said
    pip, _ = setup("test")  # an extra not installed yet
    assert pip[-1] == "-m pip install -q -e .[test]"
    assert setup()[0] == [] and setup("test")[0] == []  # what is installed covers both
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "2"\n')
    pip, _ = setup()
    assert pip[-1] == "-m pip install -q -e ."
    assert setup("test")[0][-1] == "-m pip install -q -e .[test]"  # a changed project installs its extras anew
