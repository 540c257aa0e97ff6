"""What Lightning 2.6.6 would do to a user, kept away: the per-step SIGTERM check under DDP (a host sync each
step, Lightning PR #21640) runs once an epoch, counted by a host-read counter in two real gloo processes; and no
``self.log`` in code that ``torch.compile`` traces (it crashes on torch 2.12/2.13 with Lightning 2.6.6).
About 19 CPU-seconds (two 2-rank fits, most of it process start-up)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TINY = ["--model.env.num_envs=4", "--model.replay.capacity=1000", "--model.replay.batch_size=16",
        "--model.hidden_sizes=[16, 16]", "--model.warmup_steps=64", "--model.updates_per_epoch=8",
        "--trainer.enable_progress_bar=false", "--trainer.logger=false", "--trainer.max_epochs=3",
        "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]


def _reads(run_dir: Path, *extra: str) -> list[dict]:
    args = [sys.executable, str(ROOT / "tests" / "support" / "_ddp_host_reads_script.py"), "fit",
            "--config", str(ROOT / "configs" / "dqn_cartpole.yaml"), *TINY,
            f"--trainer.default_root_dir={run_dir}", *extra]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(args, cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((run_dir / f"reads{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_the_sigterm_check_under_ddp_reads_the_host_once_an_epoch_not_every_step(tmp_path):
    """Lightning's own behaviour (``sigterm_check_interval=1``) reads the host at every step, 24 of 24: the counter
    sees them. The module's default (0) leaves one read an epoch (the check at its first step): 3 in 24 steps."""
    lightning = _reads(tmp_path / "every_step", "--model.sigterm_check_interval=1")
    ours = _reads(tmp_path / "default")
    for rank in range(2):
        assert lightning[rank]["world_size"] == ours[rank]["world_size"] == 2
        assert lightning[rank]["global_step"] == ours[rank]["global_step"] == 3 * 8
        assert lightning[rank]["sigterm_reads"] == 3 * 8  # one .item() per step: Lightning 2.6.6's check
        assert ours[rank]["sigterm_reads"] == 3  # one per epoch
        # every other host read is the same in both runs: the bound removes the check's reads and nothing else
        assert (lightning[rank]["total_reads"] - lightning[rank]["sigterm_reads"]
                == ours[rank]["total_reads"] - ours[rank]["sigterm_reads"])


def _log_calls(path: Path) -> list[str]:
    """``self.log(...)`` / ``self.log_dict(...)`` calls in one source file, as ``name:line``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.name}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("log", "log_dict") and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"]


def test_no_module_of_ours_calls_self_log():
    """Our LightningModules put their metrics in a device-side ``MetricAccumulator``, which
    ``AsyncMetricsCallback`` hands to the loggers at the epoch's end, outside any compiled code: no ``self.log`` in
    a step that ``torch.compile`` (``inductor: true``) or a CUDA graph could trace."""
    sources = sorted((ROOT / "lightning_per").rglob("*.py"))
    assert len(sources) > 20
    assert [hit for path in sources for hit in _log_calls(path)] == []


def test_the_log_call_finder_finds_a_self_log(tmp_path):
    """The finder above is not blind: it reports a ``self.log`` written in a training step."""
    source = tmp_path / "sample.py"
    source.write_text("class M:\n    def training_step(self, batch):\n        self.log('loss', batch)\n"
                      "        logger.log('x')\n")
    assert _log_calls(source) == ["sample.py:3"]
