"""A refused ``lightning-per fit --ckpt_path X`` is one line on stderr, exit status 2, and leaves the run
directory byte-identical (summary.json, config.yaml, checkpoints, W&B files: every file and its bytes).

One short run (2 epochs, tiny sizes, W&B offline as by default) makes the run directory; each case copies
it, spoils the copy's checkpoint the way the case says, and resumes it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from lightning_per import cli
from lightning_per.callbacks import AtomicCheckpointIO
from lightning_per.callbacks.checkpoint_io import CHECKPOINT_KIND
from lightning_per.dqn.ddp import SHARD_KIND, replay_shard_path
from lightning_per.integrity import file_manifest_path, save_file_manifest, save_torch_file

CONFIG = str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml")
TINY = ["--model.env.num_envs=4", "--model.replay.capacity=1000", "--model.replay.batch_size=16",
        "--model.hidden_sizes=[16, 16]", "--model.warmup_steps=64", "--model.updates_per_epoch=20",
        "--trainer.enable_progress_bar=false"]


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("first") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.delenv("WANDB_API_KEY", raising=False)
        cli.cli_main(["fit", "--config", CONFIG, *TINY, f"--trainer.default_root_dir={run}", "--trainer.max_epochs=2"])
    assert (run / "summary.json").is_file() and (run / "config.yaml").is_file()
    return run


class Marker:
    """Unpickling this creates ``path``."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _reseal(ckpt: Path, edit) -> None:
    """Load the checkpoint, ``edit`` it, save it sealed again (a consistent file this code refuses by content)."""
    io = AtomicCheckpointIO()
    checkpoint = io.load_checkpoint(ckpt)
    edit(checkpoint)
    io.save_checkpoint(checkpoint, ckpt)


def _spoil(case: str, ckpt: Path, marker: Path) -> str:
    """Spoil ``ckpt`` as ``case`` says; returns what the one-line error must contain."""
    if case == "bit flip":
        data = bytearray(ckpt.read_bytes())
        data[len(data) // 3] ^= 0x04
        ckpt.write_bytes(bytes(data))
        return "damaged"
    if case == "truncated":
        ckpt.write_bytes(ckpt.read_bytes()[:-1000])
        return "truncated"
    if case == "weights file":
        torch.save({"q_net.0.weight": torch.zeros(16, 4)}, ckpt)
        file_manifest_path(ckpt).unlink()
        return "no manifest"
    if case == "older dqn_state":
        _reseal(ckpt, lambda c: c["dqn_state"].update(version=0))
        return "dqn_state version 0 is not supported"
    if case == "nan priorities":
        def nan(c):
            raw = c["dqn_state"]["replay"]["_sampler"]["raw"]
            raw[0] = float("nan")
        _reseal(ckpt, nan)
        return "raw priorities must be finite"
    if case == "another sampler kind":
        _reseal(ckpt, lambda c: c["dqn_state"]["replay"]["_sampler"].update(kind="GPURankBasedSampler"))
        return "sampler checkpoint is from GPURankBasedSampler"
    if case == "crafted checkpoint":  # an object to run inside a checkpoint resealed with a valid manifest
        _reseal(ckpt, lambda c: c.update(extra=Marker(marker)))
        return "refused without running them"
    if case == "crafted shard":  # "shards = 1" makes a one-process resume read a shard file next to it
        def shards(c):
            c["dqn_state"]["shards"] = 1
        _reseal(ckpt, shards)
        state = AtomicCheckpointIO().load_checkpoint(ckpt)["dqn_state"]
        shard = Path(replay_shard_path(ckpt, 0, state["generation"]))
        torch.save({"generation": state["generation"], "x": Marker(marker)}, shard)
        save_file_manifest(shard, SHARD_KIND, state["generation"])  # checksums anyone can compute
        return "not a torch file of plain data"
    if case == "not a Lightning checkpoint":  # sealed: its manifest is valid
        save_torch_file({"weights": torch.zeros(16, 4)}, ckpt, CHECKPOINT_KIND, "g0")
        return "not a Lightning checkpoint of a training run"
    if case == "env_steps lots":
        _reseal(ckpt, lambda c: c["dqn_state"].update(env_steps="lots"))
        return "dqn_state.env_steps must be an int >= 0, got 'lots'"
    if case == "torch_rng of another type":
        _reseal(ckpt, lambda c: c["dqn_state"].update(torch_rng=torch.zeros(3)))
        return "dqn_state.torch_rng must be a uint8 tensor"
    raise AssertionError(case)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", ["bit flip", "truncated", "weights file", "older dqn_state", "nan priorities",
                                  "another sampler kind", "crafted checkpoint", "crafted shard",
                                  "not a Lightning checkpoint", "env_steps lots", "torch_rng of another type"])
def test_a_refused_resume_is_one_line_exit_2_and_changes_nothing(finished_run, tmp_path, capsys, case):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    ckpt, marker = run / "checkpoints" / "last.ckpt", tmp_path / "marker"
    expected = _spoil(case, ckpt, marker)
    before = _snapshot(run)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", CONFIG, *TINY, f"--trainer.default_root_dir={run}", "--trainer.max_epochs=4",
                  "--ckpt_path", str(ckpt)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and expected in err, err[-3000:]
    assert "weights_only=False" not in err  # no advice to turn the safe load off
    message = [line for line in err.splitlines() if "error:" in line]
    assert len(message) == 1 and str(ckpt) in message[0]  # one line, naming the file
    assert not marker.exists()
    after = _snapshot(run)
    assert sorted(after) == sorted(before)
    changed = [name for name in before if before[name] != after[name]]
    assert not changed, changed


def test_a_replay_capacity_no_memory_holds_is_one_line_exit_2_and_writes_no_summary(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", CONFIG, *TINY, f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false",
                  "--model.replay.capacity=1000000000000"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "capacity 1000000000000" in err
    assert not (tmp_path / "summary.json").exists()  # a start that failed is no run: nothing claims it ran
