"""The examples run as documented (short settings): they are what a new user copies first. On CPU the captured
update is the eager fallback of ``lightning_per.graphs.capture`` (the GPU tests run the graphs)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _examples import load_example

ROOT = Path(__file__).parents[2]
_SUMMARY = r"(\d+) frames, (\d+) episodes, mean return of the last 20: ([\d.]+)"


def _run(*args: str) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def _check_cartpole_summary(out: str, frames: int) -> None:
    match = re.search(_SUMMARY, out)
    assert match, out
    # CartPole-v1 cannot fail in fewer than 5 steps from its start states (|theta| <= 0.05 rad), and a
    # return is the episode length: `frames` frames hold at most frames / 5 episodes, each returning >= 5
    assert int(match.group(1)) == frames
    assert 0 < int(match.group(2)) <= frames // 5 and float(match.group(3)) >= 5.0


@pytest.mark.parametrize("name", ["torchrl_dqn_per", "lightning_module_per"])
def test_example_loads_as_a_module(name):
    """The GPU tests call the examples' functions in-process: loading one runs its dataclasses and classes."""
    module = load_example(name)
    assert module.__name__ == f"example_{name}" and f"example_{name}" not in sys.modules
    if name == "torchrl_dqn_per":
        assert dataclasses.is_dataclass(module.Learner) and callable(module.make_learner)
    else:
        assert callable(module.CartPoleDQN.build_update)


def test_torchrl_dqn_recipe_with_our_buffer_runs():
    # --capture on CPU: the eager fallback, i.e. TorchRL's plain recipe loop (8 updates per call)
    out = _run("examples/torchrl_dqn_per.py", "--frames", "600", "--learning-starts", "200", "--capture",
               "--hard-update", "20")
    _check_cartpole_summary(out, 600)


def test_own_lightning_module_with_captured_update_runs(tmp_path):
    out = _run("examples/lightning_module_per.py", "--epochs", "2", "--steps-per-epoch", "15", "--out", str(tmp_path))
    _check_cartpole_summary(out, 2 * 15 * 16)
    # warm-up 120 frames (a quarter): steps 8..29 update, 4 optimizer steps each, counted for Lightning
    assert re.search(r"(\d+) optimizer steps", out).group(1) == str((30 - 7) * 4)
    assert list(tmp_path.glob("wandb/offline-run-*/run-*.wandb")), "W&B offline run files"


def test_recurrent_dqn_from_prioritized_slices_runs():
    """The recurrent example's whole loop (episodes written whole, slices sampled, LSTM updated from stored
    states, priorities written back) in a short run."""
    out = _run("examples/recurrent_dqn.py", "--steps", "800", "--learn-start", "400", "--slices", "4")
    match = re.search(r"lstm: mean return of the last 20 episodes after (\d+) env steps: ([\d.]+) \((\d+) episodes, "
                      r"(\d+) updates", out)
    assert match, out
    # 8 envs: one update per vector step from env step 400 to 800 (51 steps); episodes last >= 5 steps
    assert int(match.group(4)) == 51 and float(match.group(2)) >= 5.0


def test_collector_writers_feed_the_learner():
    """A 2-worker TorchRL MultiSyncCollector writes into our prioritized buffer while the learner trains (spawned
    workers: most of its cost is their start)."""
    out = _run("examples/collector_writers.py", "--frames", "1280", "--learning-starts", "256")
    match = re.search(r"(\d+) frames, (\d+) transitions ingested from (\d+) workers \((\d+) dropped\), (\d+) "
                      r"updates, greedy return ([\d.]+)", out)
    assert match, out
    frames, ingested, workers, dropped, updates, ret = match.groups()
    assert (int(frames), int(ingested), int(workers), int(dropped)) == (1280, 1280, 2, 0)
    # 128 frames an iteration; len(rb) reaches 256 at the 2nd of 10: 9 iterations of 16 updates
    assert int(updates) == 9 * 16 and float(ret) >= 5.0


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the error without a GPU")
@pytest.mark.parametrize("name, argv", [("torchrl_dqn_per", ["--device", "cuda"]),
                                        ("lightning_module_per", ["--accelerator", "gpu"])])
def test_a_gpu_option_without_a_gpu_is_a_usage_error(name, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_example(name).main(argv)
    assert exit_info.value.code == 2
    assert "no CUDA device is visible" in capsys.readouterr().err
