"""A ``lightning-per fit`` killed at any instant leaves a ``last.ckpt`` that resumes.

A kill of the process group between the checkpoint's rename and its manifest left a complete checkpoint that
every resume refused, with the previous one gone. Here eight real ``fit`` processes are killed (SIGKILL to the
group, at a seeded random moment after the run's newest checkpoint appears), each one resumed from what the
previous one left; the last resume runs to its end. A kill at every step of one save, each in turn, is
``tests/checkpoints/test_integrity.py::test_a_kill_at_any_step_of_a_checkpoint_save_leaves_the_old_or_the_new_one``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from lightning_per.callbacks import AtomicCheckpointIO
from lightning_per.integrity import file_manifest_path

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--config", str(ROOT / "configs" / "dqn_cartpole.yaml"), "--model.env.num_envs=4",
        "--model.replay.capacity=1000", "--model.replay.batch_size=16", "--model.hidden_sizes=[16, 16]",
        "--model.warmup_steps=200", "--model.updates_per_epoch=5", "--trainer.enable_progress_bar=false",
        "--trainer.logger=false", "--model.max_env_steps=10000000", "--trainer.max_time=null"]


def _manifest_version(ckpt: Path) -> tuple[int, int] | None:
    """Which write of the manifest of ``ckpt`` is on disk (each save replaces it: a new inode), None: none yet."""
    try:
        st = file_manifest_path(ckpt).stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def test_eight_random_kills_of_fit_each_leave_a_checkpoint_that_resumes(tmp_path):
    run, rng = tmp_path / "run", random.Random(36)
    ckpt = run / "checkpoints" / "last.ckpt"
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "lightning_per.console", "fit", *ARGS, f"--trainer.default_root_dir={run}"]
    steps = []
    for i in range(8):
        log = tmp_path / f"fit{i}.log"
        resume = [f"--ckpt_path={ckpt}"] if i else []
        before = _manifest_version(ckpt)
        with open(log, "wb") as out:
            proc = subprocess.Popen([*cmd, "--trainer.max_epochs=100000", *resume], cwd=tmp_path, env=env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while _manifest_version(ckpt) in (before, None):  # wait until this run is saving checkpoints
                assert proc.poll() is None, f"run {i} exited {proc.returncode}: {log.read_text()[-2000:]}"
                assert time.monotonic() < deadline, f"run {i} wrote no checkpoint: {log.read_text()[-2000:]}"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.5))  # where the kill lands in the next saves (not for the result)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        checkpoint = AtomicCheckpointIO().load_checkpoint(ckpt)  # the old or the new one, never refused
        assert not steps or checkpoint["global_step"] >= steps[-1]  # a kill before a rename: the previous one
        steps.append(checkpoint["global_step"])
    assert steps[-1] > steps[0]  # the resumed runs trained on
    epochs = checkpoint["epoch"] + 3
    done = subprocess.run([*cmd, f"--trainer.max_epochs={epochs}", f"--ckpt_path={ckpt}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and summary["epochs"] == epochs
    final = AtomicCheckpointIO().load_checkpoint(ckpt)["global_step"]
    assert final > steps[-1] and (final - steps[-1]) % 5 == 0  # whole epochs of 5 updates on top of the resumed
