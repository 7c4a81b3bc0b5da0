"""The package is mypy-clean (``[tool.mypy]`` in pyproject.toml): a type error fails the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_type_checks() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "ticdc_delta"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"mypy found type errors:\n{done.stdout}{done.stderr}"
    assert "Success: no issues found" in done.stdout, done.stdout
