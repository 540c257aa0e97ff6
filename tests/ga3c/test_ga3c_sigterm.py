"""A SIGTERM to the process group of a ``lightning-per ga3c`` run (what ``kill -TERM -PGID``, a job
scheduler or a container runtime sends) stops the run: the agents, killed by that same signal, are never
replaced, the summary is written and no process of the group is left behind."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, from /proc (field 5 of stat is the pgrp)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_sigterm_to_the_process_group_stops_without_replacing_agents(tmp_path):
    cmd = [sys.executable, "-m", "lightning_per.console", "ga3c", "--config", str(ROOT / "configs/ga3c_cartpole.yaml"),
           "--model.agents", "3", "--model.envs_per_agent", "2", "--model.max_time_s", "120",
           "--model.target_return", "null",
           "--model.status_interval_s", "0.5", "--model.updates_per_epoch", "2", "--model.run_dir", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: pgid == proc.pid
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        # training has gone on for a few epochs (their history is what the interrupted run writes)
        while sum("[TPS " in ln and "[TPS    0.0" not in ln for ln in list(lines)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        members = _group_members(proc.pid)
        assert len(members) >= 4, members  # the learner and its 3 agents share the group
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(5)
    out = "".join(lines)
    assert "starting a replacement" not in out, out
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith("ga3c-cartpole-")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["agents_replaced"] == 0
    assert summary["status"] == "interrupted"
    assert proc.returncode == 128 + signal.SIGTERM, out
    deadline = time.monotonic() + 5
    while _group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group_members(proc.pid) == []
