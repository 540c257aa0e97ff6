"""The layering contracts of pyproject.toml (``[tool.importlinter]``) hold: ``lint-imports`` (import-linter, the
``dev`` extra) passes, as ``make lint`` runs it; here so that ``make test`` checks them too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    pytest.importorskip("importlinter", reason="import-linter is in the dev extra")
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe)] if exe.exists() else [shutil.which("lint-imports") or "lint-imports"]
    proc = subprocess.run([*cmd, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
