"""However a GA3C run stops, its files agree; a stopped agent is noticed; bad settings are one line.

- ``summary.json`` and ``episodes.csv`` after a normal end (``max_updates``, ``max_time_s``), SIGINT and SIGTERM to
  the process group of a ``lightning-per ga3c`` process, and an exception in training: the same episodes, the
  same env steps, and (CartPole: a return is the episode's length) returns that account for the env steps.
- an agent process sent SIGSTOP is reported in one line naming it and its pid, killed and replaced; agents
  that wait (back-pressure) are not.
- ``--env missing_module:Id`` and an unwritable ``--run_dir`` are one-line errors with exit status 2.
"""

import csv
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_per.actors.envs import TOY_ENV_ID, probe_env
from lightning_per.ga3c.cli import parse_config, prepare, run
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.module import GA3C
from lightning_per.ga3c.system import GA3CSystem

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ["--config", str(ROOT / "configs/ga3c_cartpole.yaml"), "--model.agents", "2", "--model.envs_per_agent", "2",
            "--model.target_return", "null", "--model.updates_per_epoch", "20"]
N_ENVS = 2 * 2  # agents x envs_per_agent above
CSV_HEADER = ["episode", "env_steps", "time_s", "return", "return_mean"]


def _read_run(run_dir: Path) -> tuple[dict, list[dict[str, float]]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(run_dir / "episodes.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == CSV_HEADER
        rows = [{k: float(v) for k, v in row.items()} for row in reader]
    return summary, rows


def _assert_agree(run_dir: Path, window: int = 20) -> tuple[dict, list[dict[str, float]]]:
    """summary.json and episodes.csv of a CartPole run describe the same episodes and env steps."""
    summary, rows = _read_run(run_dir)
    assert summary["episodes_csv"] == str(run_dir / "episodes.csv")
    assert summary["episodes"] == len(rows), (summary["episodes"], len(rows))
    assert [r["episode"] for r in rows] == list(range(len(rows)))
    steps = [r["env_steps"] for r in rows]
    assert steps == sorted(steps) and all(s == int(s) for s in steps)
    times = [r["time_s"] for r in rows]
    assert times == sorted(times) and all(0 <= t <= summary["wall_time_s"] for t in times)
    # env steps: those of the newest episode's end, and the total, which only unfinished episodes add to
    assert summary["last_episode_env_steps"] == (steps[-1] if rows else None)
    returns = [r["return"] for r in rows]
    assert all(r == int(r) and 1 <= r <= 500 for r in returns)  # CartPole: the return is the episode's length
    # every step of a finished episode is counted in env_steps; what is left are the N_ENVS episodes under way
    unfinished = summary["env_steps"] - sum(returns)
    assert 0 <= unfinished < N_ENVS * 500, (summary["env_steps"], sum(returns))
    if rows:
        assert rows[-1]["env_steps"] <= summary["env_steps"]
        tail = returns[-window:]
        assert summary["mean_return_episodes"] == len(tail)
        assert summary["mean_return"] == pytest.approx(sum(tail) / len(tail))
        for k, row in enumerate(rows):  # each row's mean of the newest `window` returns up to it
            part = returns[max(0, k + 1 - window):k + 1]
            assert row["return_mean"] == pytest.approx(sum(part) / len(part))
    else:
        assert summary["mean_return"] is None
    return summary, rows


# ---- (a) the summary and the CSV agree after any stop ---------------------------------------------------
def _cli(tmp_path: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "lightning_per.console", "ga3c", *CARTPOLE, "--model.max_time_s", "120",
           "--model.status_interval_s", "0.5", "--model.run_dir", str(tmp_path), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: pgid == proc.pid


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_to_the_group_leaves_a_summary_that_agrees_with_episodes_csv(tmp_path, signum):
    proc = _cli(tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        # training has gone on for a while: episodes ended in several epochs and since the last one
        while sum("[TPS " in ln and "[TPS    0.0" not in ln for ln in list(lines)) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        os.killpg(proc.pid, signum)  # Ctrl-C in a terminal signals the whole foreground group, as kill -TERM -PGID
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(5)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary, rows = _assert_agree(run_dir)
    assert summary["status"] == "interrupted" and len(rows) > 0, "".join(lines)
    assert summary["stop_reason"] is None  # no budget or target stopped it
    assert proc.returncode == 128 + signum, "".join(lines)  # the shell's convention, as lightning-per fit's


def test_max_updates_end_leaves_files_that_agree(tmp_path):
    cfg = parse_config([*CARTPOLE, "--model.max_updates", "70", "--model.status_interval_s", "0", "--model.run_dir",
                       str(tmp_path)])
    summary = run(cfg, prepare(cfg))
    (run_dir,) = list(tmp_path.iterdir())
    written, rows = _assert_agree(run_dir)
    assert written == json.loads(json.dumps(summary))
    assert written["status"] == "done" and written["stop_reason"] == "max_updates" and len(rows) > 0


def test_max_time_before_any_batch_leaves_files_that_agree(tmp_path):
    # no batch is ever complete: Lightning never reaches an epoch end, episodes end all the same
    cfg = parse_config([*CARTPOLE, "--model.max_time_s", "3", "--model.train_min_batch_size", "1000000",
                        "--model.status_interval_s", "0", "--model.run_dir", str(tmp_path)])
    run(cfg, prepare(cfg))
    (run_dir,) = list(tmp_path.iterdir())
    summary, rows = _assert_agree(run_dir)
    assert summary["stop_reason"] == "max_time_s" and summary["updates"] == 0 and len(rows) > 0


class _Failing(GA3C):
    """Raises in the 30th training step (after an epoch end at 20)."""

    def training_step(self, batch, batch_idx):
        if self.policy_version == 30:
            raise RuntimeError("injected failure")
        return super().training_step(batch, batch_idx)


def test_an_exception_in_training_leaves_files_that_agree(tmp_path):
    cfg = parse_config([*CARTPOLE, "--model.max_time_s", "120", "--model.status_interval_s", "0", "--model.run_dir",
                       str(tmp_path)])
    with pytest.raises(RuntimeError, match="injected failure"):
        run(cfg, _Failing(cfg))
    (run_dir,) = list(tmp_path.iterdir())
    summary, rows = _assert_agree(run_dir)
    assert summary["status"] == "failed" and summary["updates"] == 30 and len(rows) > 0


def test_no_finished_episode_writes_a_header_only_csv(tmp_path):
    # episodes of a billion steps: none ends in this run
    cfg = GA3CConfig(env=TOY_ENV_ID, env_kwargs={"episode_len": 10**9}, agents=2, envs_per_agent=2, t_max=5,
                     train_min_batch_size=20, hidden_sizes=[16], max_updates=25, updates_per_epoch=20,
                     max_time_s=120, status_interval_s=0, device="cpu", run_dir=str(tmp_path))
    run(cfg, prepare(cfg))
    (run_dir,) = list(tmp_path.iterdir())
    assert (run_dir / "episodes.csv").read_text() == ",".join(CSV_HEADER) + "\n"
    summary, rows = _read_run(run_dir)
    assert rows == [] and summary["episodes"] == 0 and summary["last_episode_env_steps"] is None
    assert summary["mean_return"] is None and summary["env_steps"] >= 25 * 20  # 25 updates of >= 20 transitions
    assert summary["episodes_csv"] == str(run_dir / "episodes.csv")


# ---- (b) a stopped agent is noticed by its progress ------------------------------------------------------
SPEC = {"env": "CartPole-v1", "backend": "gym", "kwargs": {}, "frame_stack": 4}
STALL_S = 1.0  # agent_stall_timeout_s of these systems (its smallest allowed value)


def _random_policy(obs):
    n = obs.shape[0]
    return torch.randint(0, 2, (n,)), torch.zeros(n)


def _system(**kw) -> GA3CSystem:
    cfg = GA3CConfig(**{"agents": 2, "envs_per_agent": 2, "status_interval_s": 0, "agent_stall_timeout_s": STALL_S,
                        **kw})
    shape, dtype, _ = probe_env({**SPEC, "num_envs": 1})
    return GA3CSystem(cfg, SPEC, shape, str(dtype), _random_policy, lambda: 0, torch.device("cpu"))


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_a_sigstopped_agent_is_reported_killed_and_replaced(ga3c_warnings):
    system = _system().start()
    pid = None
    try:
        deadline = time.monotonic() + 30
        # agent 0 runs its loop (an agent still starting is not watched: it beats from its first step on)
        assert _wait(lambda: system.shared.started[0] and system.shared.heartbeat[0] > 0, timeout=30)
        victim = system.pool.agents[0]
        pid = victim.process.pid
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        assert _wait(lambda: system.pool.replaced == 1, timeout=STALL_S + 10)
        noticed_s = time.monotonic() - stopped_at
        # silence is counted from the supervisor pass before the stop at the earliest, one 0.2 s period
        assert STALL_S - 0.2 <= noticed_s, noticed_s
        assert victim.process.exitcode == -signal.SIGKILL  # killed, not left stopped
        (line,) = [ln for ln in ga3c_warnings if "agent 0" in ln]
        assert f"(pid {pid})" in line and "agent_stall_timeout_s" in line and "\n" not in line
        assert system.pool.agents[0] is not victim and system.pool.agents[0].incarnation != victim.incarnation
        assert system.counts().agents == 2 and not system.stopping.is_set()
        steps = system.stats.snapshot().steps
        # the replacement and the other agent deliver: batches queued before the stop may be taken first, so
        # keep taking until new steps are counted
        got = 0
        while (got < 3 or system.stats.snapshot().steps <= steps) and time.monotonic() < deadline + 30:
            got += system.get_batch(timeout=1.0) is not None
        assert got >= 3 and system.stats.snapshot().steps > steps
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        system.close()


def test_agents_blocked_by_back_pressure_are_not_taken_as_stalled(ga3c_warnings):
    system = _system(batch_queue_size=1).start()
    try:
        # nobody takes batches: the queue fills, trainers stop taking rollouts, agents wait for free slots
        assert _wait(lambda: system.batch_q.full() and system.shared.busy[:2].all(), timeout=30)
        beats = system.shared.heartbeat[:2].copy()
        steps = system.stats.snapshot().steps
        system.stopping.wait(2.5 * STALL_S)  # an observation window: nothing may happen in it
        # no rollout was taken and every slot stayed busy: both agents waited for a free slot all along ...
        assert system.stats.snapshot().steps == steps and system.shared.busy[:2].all()
        assert (system.shared.heartbeat[:2] > beats).all()  # ... and beat while waiting
        assert system.pool.replaced == 0 and not ga3c_warnings, ga3c_warnings
    finally:
        system.close()


@pytest.mark.parametrize("value", [0.0, 0.5, -1.0, float("nan"), float("inf"), "soon", True])
def test_agent_stall_timeout_is_validated(value):
    with pytest.raises(ValueError, match="agent_stall_timeout_s"):
        GA3CConfig(agent_stall_timeout_s=value).validate()


# ---- (c) setting errors of the command line are one line, exit status 2 ----------------------------------
def _console(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lightning_per.console", "ga3c", *CARTPOLE, "--model.max_time_s", "5", *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_an_env_of_a_missing_module_is_one_line_exit_2(tmp_path):
    out = _console(tmp_path, "--model.env", "missing_module:Id", "--model.run_dir", str(tmp_path / "runs"))
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("lightning-per ga3c: error: env 'missing_module:Id'") and "'missing_module'" in line
    assert not (tmp_path / "runs").exists()


def test_a_run_dir_under_a_file_is_one_line_exit_2(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("keep me\n")
    out = _console(tmp_path, "--model.run_dir", str(blocker / "runs"))
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"lightning-per ga3c: error: run_dir '{blocker / 'runs'}'"), line
    assert blocker.read_text() == "keep me\n" and sorted(p.name for p in tmp_path.iterdir()) == ["not_a_dir"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_run_dir_is_one_line_exit_2(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        out = _console(tmp_path, "--model.run_dir", str(parent))
    finally:
        parent.chmod(0o755)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"lightning-per ga3c: error: run_dir '{parent}'") and "Permission denied" in line
    assert list(parent.iterdir()) == []


def test_trainers_claim_the_oldest_rollouts_first():
    """With every agent's finished rollouts ready (the trainer blocked on a full batch queue, the agents on their
    slots), a claim of k rollouts takes the k whose first step the oldest policy version predicted, whatever their
    agent's index: no agent's rollouts wait while others refill."""
    versions = itertools.count()
    cfg = GA3CConfig(agents=4, envs_per_agent=1, t_max=2, rollout_slots=3, trainers=1, train_min_batch_size=2,
                     batch_queue_size=1, status_interval_s=0, agent_stall_timeout_s=60.0)
    shape, dtype, _ = probe_env({**SPEC, "num_envs": 1})
    system = GA3CSystem(cfg, SPEC, shape, str(dtype), _random_policy, lambda: next(versions),
                        torch.device("cpu")).start()
    try:
        sh = system.shared
        # each agent: 2 rollouts ready, the third filled and waiting for a free slot to bootstrap from V(s_T)
        assert _wait(lambda: np.count_nonzero(sh.ready) == 4 * 2, 120.0), f"the agents did not fill: {sh.ready}"
        ii, ss = np.nonzero(sh.ready)
        first = sh.versions[ii, ss, 0].copy()  # the version that predicted each ready rollout's first step
        claimed = system.claim_rollouts(5)
        got = sorted(int(sh.versions[i, s, 0]) for i, _, s in claimed)
    finally:
        system.close()
    assert got == sorted(first.tolist())[:5]
