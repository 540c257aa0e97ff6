"""The examples run as documented (short settings): they are what a new user copies first."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _run(*args: str) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_torchrl_dqn_recipe_with_our_buffer_runs():
    out = _run("examples/torchrl_dqn_per.py", "--frames", "1500")
    match = re.search(r"(\d+) episodes, mean return of the last 20: ([\d.]+)", out)
    assert match, out
    # CartPole-v1 cannot fail in fewer than 5 steps from its start states (|theta| <= 0.05 rad), and a
    # return is the episode length: 1500 frames hold at most 300 episodes, each returning >= 5
    assert 0 < int(match.group(1)) <= 300 and float(match.group(2)) >= 5.0
