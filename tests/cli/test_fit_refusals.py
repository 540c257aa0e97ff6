"""``lightning-per fit`` refuses, in one line naming the file or option (exit status 2, no traceback), a checkpoint
that is no Lightning checkpoint or whose ``dqn_state`` holds values of the wrong type, a run directory it cannot
write, and a thread count below 1 -- and leaves the run directory's ``config.yaml`` byte-identical.

The short run (2 epochs, tiny sizes, W&B offline) is the real command in a child process (``python -m
lightning_per.console fit ...``), and so are a refusal's exit status and stderr of a whole process (a run directory
under a file), a failure after setup (a callback of tests/support) and a resume's warning on stderr. The other cases
call the console's entry point, :func:`lightning_per.console.main`, with the same argv in this process, on a copy
of that run's directory: their point is the refusal's one line and the files left, and a child's ~5 s of imports
each was most of their time. A refusal there is the ``SystemExit(2)`` that is the child's exit status 2, and its
stderr is read at the file descriptor (``capfd``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Trainer

from lightning_per import console
from lightning_per.callbacks import AtomicCheckpointIO
from lightning_per.dqn import DQN, ReplayConfig
from lightning_per.envs import EnvConfig
from lightning_per.integrity import file_manifest_path, save_torch_file

CONFIG = str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml")
TINY = ["--model.env.num_envs=4", "--model.replay.capacity=1000", "--model.replay.batch_size=16",
        "--model.hidden_sizes=[16, 16]", "--model.warmup_steps=64", "--model.updates_per_epoch=20",
        "--trainer.enable_progress_bar=false"]
ENV = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "LIGHTNING_PER_TRACEBACK": ""}
ENV.pop("WANDB_API_KEY", None)


def _argv(run: Path, *extra: str, epochs: int) -> list[str]:
    """``lightning-per fit``'s arguments on the tiny config."""
    return ["fit", "--config", CONFIG, *TINY, f"--trainer.default_root_dir={run}", f"--trainer.max_epochs={epochs}",
            *extra]


def _fit(run: Path, *extra: str, epochs: int = 2) -> subprocess.CompletedProcess:
    """``lightning-per fit`` on the tiny config in a child process."""
    return subprocess.run([sys.executable, "-m", "lightning_per.console", *_argv(run, *extra, epochs=epochs)],
                          env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture
def fit_here(monkeypatch, capfd):
    """``lightning-per fit`` on the tiny config in this process, through the console's entry point; returns the
    exit status (``main``'s return value, or the code of the ``SystemExit`` it raised: what ``sys.exit(main())``
    makes the process's status) and stderr."""
    for name in ("WANDB_MODE", "WANDB_SILENT", "LIGHTNING_PER_TRACEBACK"):  # the child's: W&B offline, no traceback
        monkeypatch.setenv(name, ENV[name])
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    threads = torch.get_num_threads()

    def fit(run: Path, *extra: str, epochs: int = 2) -> tuple[int | str | None, str]:
        capfd.readouterr()
        try:
            status = console.main(_argv(run, *extra, epochs=epochs))
        except SystemExit as stop:
            status = stop.code
        finally:
            torch.set_num_threads(threads)  # --torch_num_threads set this process's: not for the later tests
        return status, capfd.readouterr().err
    return fit


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("first") / "run"
    proc = _fit(run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    return run


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _reseal(ckpt: Path, edit) -> None:
    """Load the checkpoint, ``edit`` it, save it sealed again (its manifest is valid: refused by content only)."""
    io = AtomicCheckpointIO()
    checkpoint = io.load_checkpoint(ckpt)
    edit(checkpoint)
    io.save_checkpoint(checkpoint, ckpt)


def _set(path: str, value):
    """An edit setting ``checkpoint[a][b]...`` (``path`` "a.b...") to ``value``."""
    *parents, last = path.split(".")

    def edit(checkpoint):
        node = checkpoint
        for key in parents:
            node = node[int(key) if isinstance(node, list) else key]
        node[last] = value
    return edit


def _refused(result: subprocess.CompletedProcess | tuple[int | str | None, str]) -> str:
    """The last non-empty line of stderr, after checking that the command was refused as a usage error; ``result``
    is a child's (:func:`_fit`) or the exit status and stderr of a command run here (``fit_here``)."""
    status, stderr = (result.returncode, result.stderr) if isinstance(result, subprocess.CompletedProcess) else result
    assert status == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.strip()][-1]


# (case, how the checkpoint is spoilt, what the one line must name besides the file)
CHECKPOINTS = {
    "a sealed torch file that is no Lightning checkpoint": (
        lambda ckpt: save_torch_file({"weights": torch.zeros(4, 16)}, ckpt, "checkpoint", "g0"),
        ["not a Lightning checkpoint", "state_dict"]),
    "no state_dict": (lambda ckpt: _reseal(ckpt, lambda c: c.pop("state_dict")), ["'state_dict'"]),
    "torch_rng of another dtype and shape": (
        lambda ckpt: _reseal(ckpt, _set("dqn_state.torch_rng", torch.zeros(3))),
        ["dqn_state.torch_rng", "uint8", f"({torch.get_rng_state().numel()},)", "float32 tensor of shape (3,)"]),
    "torch_rng a string": (lambda ckpt: _reseal(ckpt, _set("dqn_state.torch_rng", "abc")),
                           ["dqn_state.torch_rng", "'abc'"]),
    "env_steps lots": (lambda ckpt: _reseal(ckpt, _set("dqn_state.env_steps", "lots")),
                       ["dqn_state.env_steps", "int >= 0", "'lots'"]),
    "credit nan": (lambda ckpt: _reseal(ckpt, _set("dqn_state.credit", float("nan"))), ["dqn_state.credit"]),
    "collector rng of another size": (
        lambda ckpt: _reseal(ckpt, _set("dqn_state.collector.rng", torch.zeros(16, dtype=torch.uint8))),
        ["dqn_state.collector.rng"]),
    "weights of another shape": (  # the first layer of the MLP of hidden_sizes [16, 16] on CartPole's 4 inputs
        lambda ckpt: _reseal(ckpt, lambda c: c["state_dict"].update({"q_net.torso.net.0.weight": torch.zeros(3, 3)})),
        ["state_dict['q_net.torso.net.0.weight']", "(16, 4)", "(3, 3)"]),
    "optimizer moments of another shape": (
        lambda ckpt: _reseal(ckpt, lambda c: c["optimizer_states"][0]["state"][0].update(exp_avg=torch.zeros(7))),
        ["optimizer_states[0]", "exp_avg", "(16, 4)"]),
    "loop progress lots": (
        lambda ckpt: _reseal(ckpt, _set("loops.fit_loop.epoch_progress.total.completed", "lots")),
        ["loops.fit_loop.epoch_progress.total.completed"]),
    "run summary state of the wrong type": (
        lambda ckpt: _reseal(ckpt, _set("callbacks.RunArtifactsCallback.wall_time_s", "long")),
        ["callbacks['RunArtifactsCallback']", "wall_time_s"]),
}


@pytest.mark.parametrize("case", list(CHECKPOINTS))
def test_a_checkpoint_of_the_wrong_structure_is_one_line_exit_2_and_rewrites_nothing(finished_run, tmp_path, fit_here,
                                                                                      case):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    ckpt = run / "checkpoints" / "last.ckpt"
    spoil, names = CHECKPOINTS[case]
    spoil(ckpt)
    config, sealed = _sha256(run / "config.yaml"), _sha256(ckpt)
    line = _refused(fit_here(run, "--ckpt_path", str(ckpt), epochs=4))
    assert str(ckpt) in line and all(name in line for name in names), line
    assert _sha256(run / "config.yaml") == config
    assert _sha256(ckpt) == sealed
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in finished_run.iterdir())


@pytest.mark.parametrize("value", ["0", "-2"])
def test_torch_num_threads_below_1_is_one_line_naming_the_option_and_range(finished_run, tmp_path, fit_here, value):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    config = _sha256(run / "config.yaml")
    line = _refused(fit_here(run, "--torch_num_threads", value))
    assert "--torch_num_threads" in line and ">= 1" in line and f"got {value}" in line, line
    assert _sha256(run / "config.yaml") == config


def test_a_run_directory_under_a_file_is_one_line_naming_the_option(tmp_path):
    """A parent that is a regular file: no user (root included) can create the run directory."""
    parent = tmp_path / "notes.txt"
    parent.write_text("not a directory\n")
    line = _refused(_fit(parent / "run"))
    assert "--trainer.default_root_dir" in line and str(parent / "run") in line and "is a file" in line, line
    assert parent.read_text() == "not a directory\n"


def test_a_read_only_run_directory_is_one_line_naming_the_option(finished_run, tmp_path, fit_here):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    config = _sha256(run / "config.yaml")
    run.chmod(0o555)
    try:
        try:  # root writes through the mode bits: then there is nothing to refuse
            (run / "probe").touch()
        except PermissionError:
            pass
        else:
            (run / "probe").unlink()
            pytest.skip("this user writes into a directory of mode 0o555 (root)")
        line = _refused(fit_here(run, epochs=4))
    finally:
        run.chmod(0o755)
    assert "--trainer.default_root_dir" in line and str(run) in line and "not writable" in line, line
    assert _sha256(run / "config.yaml") == config


def test_on_load_checkpoint_names_the_key_of_a_wrongly_typed_dqn_state(tmp_path):
    """Through Trainer.fit alone (no command line): the module refuses the state before restoring any of it."""
    def model():
        return DQN(env=EnvConfig(backend="torch", num_envs=4), replay=ReplayConfig(capacity=256, batch_size=16),
                   hidden_sizes=[16], warmup_steps=32, updates_per_epoch=4, seed=0)

    def trainer(epochs):
        return Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)

    first = trainer(1)
    first.fit(model())
    ckpt = tmp_path / "first.ckpt"
    first.save_checkpoint(ckpt)
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["dqn_state"]["updates"] = 2.5
    torch.save(checkpoint, ckpt)
    resumed = model()
    with pytest.raises(ValueError) as info:
        trainer(2).fit(resumed, ckpt_path=str(ckpt))
    message = str(info.value)
    assert "dqn_state.updates must be an int >= 0, got 2.5" in message and str(ckpt) in message
    assert "\n" not in message
    assert resumed.updates == 0  # nothing restored


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (W&B folders, checkpoints, logs) and its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# the finished run: 2 epochs of 20 updates (TINY), so its checkpoint has finished 2 epochs and 40 steps
@pytest.mark.parametrize("epochs, option, names", [
    (0, None, ["--trainer.max_epochs=0", "2 epochs", "at least 3"]),  # Lightning raises: epoch 1 > max_epochs 0
    (1, None, ["--trainer.max_epochs=1", "2 epochs", "at least 3"]),  # Lightning would train nothing
    (4, "--trainer.max_steps=39", ["--trainer.max_steps=39", "40 steps", "at least 41"]),
])
def test_a_resume_below_the_checkpoints_epochs_or_steps_is_one_line_exit_2_and_changes_nothing(
        finished_run, tmp_path, fit_here, epochs, option, names):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    ckpt = run / "checkpoints" / "last.ckpt"
    before = _snapshot(run)
    line = _refused(fit_here(run, "--ckpt_path", str(ckpt), *([option] if option else []), epochs=epochs))
    assert str(ckpt) in line and all(name in line for name in names), line
    assert _snapshot(run) == before


def test_a_resume_failing_after_setup_leaves_config_yaml_as_it_was(finished_run, tmp_path):
    """config.yaml is written when training starts: a failure where Trainer.fit restores the checkpoint's loops and
    optimizer (after the setup hooks) leaves the earlier run's file, though this resume's settings differ."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    config = _sha256(run / "config.yaml")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "support"),
                                                 os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "lightning_per.console", "fit", "--config", CONFIG, *TINY,
                           f"--trainer.default_root_dir={run}", "--trainer.max_epochs=4", "--trainer.logger=false",
                           "--trainer.callbacks+=_interrupt_cb.FailAtFitStart",
                           "--ckpt_path", str(run / "checkpoints" / "last.ckpt")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "failed at fit start" in proc.stderr, proc.stderr[-3000:]
    assert _sha256(run / "config.yaml") == config


def _copy_with_manifest(ckpt: Path, copy: Path) -> None:
    """``cp X.ckpt Y.ckpt; cp X.ckpt.manifest.json Y.ckpt.manifest.json``: a backup made by hand."""
    shutil.copyfile(ckpt, copy)
    shutil.copyfile(file_manifest_path(ckpt), file_manifest_path(copy))


def test_a_checkpoint_copied_with_its_manifest_resumes(finished_run, tmp_path, fit_here):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    backup = run / "bak.ckpt"
    _copy_with_manifest(run / "checkpoints" / "last.ckpt", backup)
    status, stderr = fit_here(run, "--ckpt_path", str(backup), epochs=3)
    assert status == 0, stderr[-3000:]
    resumed = AtomicCheckpointIO().load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert (resumed["epoch"], resumed["global_step"]) == (2, 60)  # one epoch of 20 updates on top of 2 x 20


def test_a_manifest_copied_beside_another_checkpoint_is_refused(finished_run, tmp_path, fit_here):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    ckpt, other = run / "checkpoints" / "last.ckpt", run / "other.ckpt"
    _copy_with_manifest(ckpt, other)
    _reseal(other, _set("dqn_state.env_steps", 12345))  # another content, sealed under its own name
    shutil.copyfile(file_manifest_path(ckpt), file_manifest_path(other))  # then last.ckpt's manifest beside it
    before = _snapshot(run)
    line = _refused(fit_here(run, "--ckpt_path", str(other), epochs=4))
    assert str(other) in line and "is the manifest of last.ckpt" in line and "does not hold" in line, line
    assert _snapshot(run) == before


def test_a_resume_with_another_seed_on_the_command_line_is_one_line_exit_2_and_changes_nothing(finished_run, tmp_path,
                                                                                                fit_here):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    ckpt = run / "checkpoints" / "last.ckpt"
    before = _snapshot(run)
    line = _refused(fit_here(run, "--ckpt_path", str(ckpt), "--seed_everything=7", epochs=4))
    assert "--seed_everything=7" in line and str(ckpt) in line and "seed_everything=0" in line, line
    assert _snapshot(run) == before


def test_a_resume_whose_config_file_has_another_seed_records_the_checkpoints(finished_run, tmp_path):
    """The finished run took seed_everything from configs/dqn_cartpole.yaml; a second config file changing it is
    named in a warning, and config.yaml records the seed the checkpoint's RNG states came from."""
    seed = yaml.safe_load(Path(CONFIG).read_text())["seed_everything"]
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    extra = tmp_path / "seed.yaml"
    extra.write_text(f"seed_everything: {seed + 5}\n")
    proc = _fit(run, "--config", str(extra), "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), epochs=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"seed_everything={seed} (config: {seed + 5})" in proc.stderr
    assert yaml.safe_load((run / "config.yaml").read_text())["seed_everything"] == seed
