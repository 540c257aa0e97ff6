"""The ``lightning-per fit`` command end to end, with tiny sizes (each run a few seconds on 2 cores)."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Trainer

from lightning_per import cli, console
from lightning_per.callbacks import read_wandb_history
from lightning_per.dqn import DQN, ReplayConfig
from lightning_per.envs import EnvConfig

TINY = ["--model.env.num_envs=4", "--model.replay.capacity=1000", "--model.replay.batch_size=16",
        "--model.hidden_sizes=[16, 16]", "--model.warmup_steps=64", "--model.updates_per_epoch=20",
        "--trainer.enable_progress_bar=false"]


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def _fit(run_dir: Path, *extra: str, epochs: int = 3, logger: bool = False):
    args = ["fit", "--config", str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml"), *TINY,
            f"--trainer.default_root_dir={run_dir}", f"--trainer.max_epochs={epochs}"]
    if not logger:
        args.append("--trainer.logger=false")
    return cli.cli_main([*args, *extra])


def test_fit_writes_checkpoint_summary_plot_and_one_wandb_row_per_epoch(tmp_path):
    run = _fit(tmp_path, epochs=3, logger=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "done"
    assert summary["updates"] == 60 and summary["epochs"] == 3
    assert summary["env_steps"] >= 64 and summary["world_size"] == 1 and summary["device"] == "cpu"
    assert math.isfinite(summary["metrics"]["loss"])
    assert summary["updates_per_s"] > 0
    assert (tmp_path / "learning_curve.png").stat().st_size > 0
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert "dqn_state" in ckpt and "replay" in ckpt["dqn_state"]
    rows = [r for r in read_wandb_history(tmp_path / "wandb", timeout_s=60) if "train/loss" in r]
    assert len(rows) == 3
    assert all(math.isfinite(r["train/loss"]) for r in rows)
    assert run.model.env_steps == summary["env_steps"]


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    full = _fit(tmp_path / "full", epochs=4)
    _fit(tmp_path / "part", epochs=2)
    resumed = _fit(tmp_path / "part", "--ckpt_path", str(tmp_path / "part" / "checkpoints" / "last.ckpt"),
                   epochs=4)
    assert (resumed.model.env_steps, resumed.model.updates) == (full.model.env_steps, full.model.updates)
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=f"{name} differs after resume")
    torch.testing.assert_close(full.model.rb.sample()["index"], resumed.model.rb.sample()["index"])


def test_interrupted_run_leaves_the_last_epochs_checkpoint(tmp_path):
    """Ctrl-C in epoch 3 leaves checkpoints/last.ckpt of epoch 2 (written at that epoch's end)."""
    with contextlib.suppress(SystemExit, KeyboardInterrupt):
        _fit(tmp_path, "--trainer.callbacks+=_interrupt_cb.InterruptAt", "--trainer.callbacks.epoch=2", epochs=5)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["epoch"] == 1 and ckpt["global_step"] == 40  # epochs 0 and 1 done, 20 updates each
    assert not (tmp_path / "checkpoints" / "last-v1.ckpt").exists()


def test_torch_env_backend_runs_through_the_cli(tmp_path):
    run = _fit(tmp_path, "--model.env.backend=torch", "--model.n_step=1", "--model.double_dqn=false",
               "--model.dueling=true", "--model.target_tau=0.01", epochs=1)
    assert run.model.updates == 20
    assert (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("arg, match", [
    ("--model.n_step=0", "n_step"),
    ("--model.gamma=1.5", "gamma"),
    ("--model.replay.batch_size=5000", "replay.batch_size"),
    ("--model.replay.capacity=10", r"replay.batch_size \(16\) must not exceed replay.capacity \(10\)"),
    ("--model.env.num_envs=0", "env.num_envs"),
    ("--torch_num_threads=0", "torch_num_threads"),
    ("--model.seed=-1", r"seed must be in \[0, 2147483647\], got -1"),  # rank r seeds seed + 1000 r + 2 < 2**32
    ("--model.seed=2147483648", r"seed must be in \[0, 2147483647\]"),
    ("--seed_everything=-1", r"--seed_everything must be an int in \[0, 4294967295\]"),  # np.random.seed's range
    ("--seed_everything=4294967296", r"--seed_everything must be an int in \[0, 4294967295\]"),
])
def test_bad_config_values_raise_value_errors_naming_the_argument(tmp_path, arg, match):
    with pytest.raises(ValueError, match=match):
        _fit(tmp_path, arg, epochs=1)


def test_a_refused_fit_leaves_no_run_directory(tmp_path):
    """The W&B logger is built before the model refuses its arguments: it must not create the run directory."""
    with pytest.raises(ValueError, match="gamma"):
        _fit(tmp_path / "run", "--model.gamma=1.5", epochs=1, logger=True)
    assert not (tmp_path / "run").exists()


def _refusal(capsys, root, *args: str) -> str:
    """The stderr of ``lightning-per fit --config configs/dqn_cartpole.yaml`` with ``args``, refused with exit
    status 2."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml"),
                  f"--trainer.default_root_dir={root}", *args])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_console_command_reports_a_bad_value_in_one_line(tmp_path, capsys):
    err = _refusal(capsys, tmp_path, "--model.gamma=2")
    assert "gamma" in err and "Traceback" not in err
    assert "fit --help" in err  # the subcommand's usage and tip, not the top level's


@pytest.mark.parametrize("arg", ["--model.seed=-1", "--seed_everything=-1"])
def test_console_command_reports_a_bad_seed_in_one_line_and_writes_nothing(tmp_path, capsys, arg):
    err = _refusal(capsys, tmp_path / "run", arg)
    assert "seed" in err and "got -1" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_console_command_reports_a_bad_choice_without_the_option_listing(tmp_path, capsys):
    """A value outside a Literal's choices (jsonargparse's own check) names the key and the choices, after
    one usage line instead of every option."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml"),
                  f"--trainer.default_root_dir={tmp_path}", "--model.replay.sampler=bogus"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--model.replay.sampler: Expected" in err and "'proportional', 'rank', 'uniform'" in err
    assert "bogus" in err and "NestedArg" not in err and "--trainer.max_epochs" not in err
    assert len(err.splitlines()) == 3, err  # usage, tip, error


@pytest.mark.parametrize("argv, message", [
    (["--model.max_env=250"],
     "unrecognized arguments: --model.max_env=250 (did you mean --model.env or --model.max_env_steps?)"),
    (["--trainer.max_epoch", "3"],
     "unrecognized arguments: --trainer.max_epoch (did you mean --trainer.max_epochs or --trainer.min_epochs?) 3"),
    (["--model.gama", "0.9"], "unrecognized arguments: --model.gama (did you mean --model.gamma?) 0.9"),
    (["--zzzz", "1"], "unrecognized arguments: --zzzz 1"),
])
def test_an_abbreviated_or_misspelt_option_is_refused_with_the_closest_ones(tmp_path, capsys, argv, message):
    """No argparse-style abbreviations (``--trainer.max_epoch 3`` used to set max_epochs): an option that is not
    the parser's is refused, naming the closest ones."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml"),
                  f"--trainer.default_root_dir={tmp_path}", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"error: {message}", err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("option, message", [
    ("--model.replay.capacty=10", "unrecognized arguments: --model.replay.capacty=10 (did you mean "
                                  "--model.replay.capacity or --model.replay.alpha?)"),
    ("--model.env.idd=x", "unrecognized arguments: --model.env.idd=x (did you mean --model.env.id or --model.env?)"),
    ("--model.replay.zzzz=1", "unrecognized arguments: --model.replay.zzzz=1 (did you mean --model.replay or "
                              "--model.replay.eps?)"),
])
def test_a_misspelt_nested_option_is_one_line_with_the_closest_fields(tmp_path, capsys, option, message):
    """A typo inside a nested config names the full option and the fields it may have meant (ReplayConfig's and
    EnvConfig's own field names, options of their own since the nested fields are listed), as any misspelt option
    is reported, not jsonargparse's union report (NestedArg, NoneType, class paths)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml"),
                  f"--trainer.default_root_dir={tmp_path}", option])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"error: {message}", err
    assert len(err.splitlines()) == 3 and "NestedArg" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error")
def test_graph_mode_on_cpu_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="CUDA"):
        _fit(tmp_path, "--model.compile=true", epochs=1)


def test_main_dispatches_ga3c_to_its_own_cli(capsys):
    with pytest.raises(SystemExit) as exit_info:  # GA3C's LightningCLI (lightning_per.cli.GA3CCLI) answers
        console.main(["ga3c", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.startswith("usage: lightning-per ga3c") and "--model.agents" in out


@pytest.mark.parametrize("name", ["dqn_cartpole.yaml", "dqn_cartpole_gpu.yaml", "dqn_pong.yaml", "dqn_atari.yaml",
                                  "dqn_cartpole_apex.yaml", "dqn_pong_apex.yaml"])
def test_shipped_configs_build_the_model_and_name_real_trainer_arguments(name):
    cfg = yaml.safe_load((Path(__file__).parents[2] / "configs" / name).read_text())
    assert set(cfg["trainer"]) <= set(inspect.signature(Trainer.__init__).parameters)
    model = dict(cfg["model"])
    env = EnvConfig(**model.pop("env"))
    if env.backend == "ale" and importlib.util.find_spec("ale_py") is None:
        pytest.skip("needs ale_py")
    DQN(env=env, replay=ReplayConfig(**model.pop("replay")), **model)


@pytest.mark.parametrize(("env_id", "rom"), [("ALE/SpaceInvaders-v5", "space_invaders"),
                                             ("ALE/Breakout-v5", "breakout")])
def test_the_atari_config_takes_any_ale_id_with_the_pong_preprocessing(env_id, rom):
    """configs/dqn_atari.yaml through the real CLI parser with another game: the model's action count is the
    game's minimal action set (ale-py's own ALEInterface), and the env it builds gives the frames a bare ale-py
    vector env gives for the same seed, with the Pong config's preprocessing settings."""
    ale_py = pytest.importorskip("ale_py")
    from ale_py.vector_env import AtariVectorEnv

    from lightning_per.envs import make_env

    config = Path(__file__).parents[2] / "configs" / "dqn_atari.yaml"
    built = cli.cli_main(["--config", str(config), "--model.env.id", env_id, "--trainer.accelerator=cpu",
                          "--model.compile=false", "--model.inductor=false", "--model.updates_per_graph=1",
                          "--model.env.num_envs=2",
                          "--model.replay.capacity=1000", "--trainer.logger=false"], run=False)
    model = built.model
    pong = yaml.safe_load((config.parent / "dqn_pong.yaml").read_text())["model"]["env"]
    env_cfg = model.env_config
    assert env_cfg.id == env_id and env_cfg.backend == "ale_vector"
    for key in ("frame_stack", "frame_skip", "screen_size", "noop_max", "repeat_action_probability"):
        assert getattr(env_cfg, key) == pong[key], key
    ale = ale_py.ALEInterface()
    ale.loadROM(ale_py.roms.get_rom_path(rom))
    assert model.n_actions == len(ale.getMinimalActionSet())
    env = make_env(env_cfg, seed=5)
    bare = AtariVectorEnv(rom, 2, num_threads=1, autoreset_mode="SameStep", noop_max=pong["noop_max"],
                          repeat_action_probability=0.0, reward_clipping=False)
    try:
        td = env.reset()
        obs, _ = bare.reset(seed=5)
        assert td["observation"].shape == (2, 4, 84, 84) and td["observation"].dtype == torch.uint8
        assert torch.equal(td["observation"], torch.from_numpy(obs))
    finally:
        env.close()
        bare.close()


def test_updates_per_step_changes_nothing_but_the_step_grouping(tmp_path):
    """Four updates per Lightning step run the same update/collection sequence as one per step: the
    final weights, counters and replay state are bit-identical, and global_step still counts updates."""
    one = _fit(tmp_path / "one", epochs=2)
    four = _fit(tmp_path / "four", "--model.updates_per_step=4", epochs=2)
    assert four.trainer.global_step == one.trainer.global_step == 40
    assert (four.model.env_steps, four.model.updates) == (one.model.env_steps, one.model.updates)
    for (name, a), b in zip(one.model.state_dict().items(), four.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=f"{name} differs")
    torch.testing.assert_close(one.model.rb.sample()["index"], four.model.rb.sample()["index"])


def test_updates_per_step_must_divide_updates_per_epoch():
    with pytest.raises(ValueError, match="updates_per_step must divide updates_per_epoch"):
        DQN(env=EnvConfig(backend="torch", num_envs=4), updates_per_epoch=10, updates_per_step=4)


def test_a_stop_inside_an_epoch_logs_current_host_counters(tmp_path):
    """A stop decided after a step (Timer/max_time) ends the epoch early; the last row's env_steps and
    updates must be the run's final counters, not the previous epoch's."""
    run = _fit(tmp_path, "--trainer.callbacks+=_interrupt_cb.StopAfterBatch",
               "--trainer.callbacks.epoch=1", "--trainer.callbacks.batch=4", epochs=3)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["updates"] == 20 + 5 == run.model.updates  # one full epoch of 20, then 5 steps
    assert summary["metrics"]["updates"] == run.model.updates
    assert summary["metrics"]["env_steps"] == run.model.env_steps


@pytest.mark.parametrize("arg, match", [
    ("--model.env.id=CartPol-v1", "env.id 'CartPol-v1'"),
    ("--ckpt_path=does/not/exist.ckpt", "ckpt_path 'does/not/exist.ckpt' does not exist"),
    ("--trainer.max_epochs=-5", "trainer.max_epochs must be >= 0, or -1 for no limit, got -5"),
    ("--trainer.max_time=5min", "is not a valid duration"),  # Lightning's MisconfigurationException
    ("--trainer.gradient_clip_val=1.0", "use --model.grad_clip_norm"),
    ("--trainer.accumulate_grad_batches=2", "trainer.accumulate_grad_batches must be 1"),
    ("--trainer.accelerator=tpu", "torch_xla"),  # Lightning's ImportError: no TPU package here
])
def test_setup_errors_are_one_line_and_leave_the_run_dir_alone(tmp_path, capsys, arg, match):
    (tmp_path / "summary.json").write_text('{"status": "done"}')
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml"),
                  f"--trainer.default_root_dir={tmp_path}", arg])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
    assert (tmp_path / "summary.json").read_text() == '{"status": "done"}'  # the earlier run's file
    assert not (tmp_path / "config.yaml").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
@pytest.mark.parametrize("arg", ["--trainer.accelerator=gpu", "--model.compile=true"])
def test_gpu_settings_without_a_gpu_are_one_line_errors(tmp_path, capsys, arg):
    err = _refusal(capsys, tmp_path, arg)
    assert "--trainer.accelerator cpu" in err or "--model.compile false" in err
    assert not (tmp_path / "summary.json").exists()


def test_an_unknown_command_names_both_commands(capsys):
    assert console.main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "'trian'" in err and "fit" in err and "ga3c" in err and len(err.splitlines()) == 1


def test_help_offers_fit_only(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "fit" in out and "validate" not in out and "predict" not in out and "ga3c" in out


def _ckpt(run_dir: Path, *extra: str, epochs: int = 2) -> str:
    """A short run's checkpoint (its path)."""
    _fit(run_dir, *extra, epochs=epochs)
    return str(run_dir / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize("option", ["--model.max_env_steps=250"])
def test_resume_takes_a_larger_env_step_budget_from_the_command_line(tmp_path, option):
    """--model.max_env_steps bounds the run, so a resumed run takes the new value (Lightning alone would
    restore the checkpoint's and stop at once)."""
    first = _fit(tmp_path, "--model.max_env_steps=100", epochs=6)
    assert 100 <= first.model.env_steps and first.model.hparams.max_env_steps == 100
    resumed = _fit(tmp_path, "--ckpt_path", str(tmp_path / "checkpoints" / "last.ckpt"), option, epochs=6)
    assert resumed.model.hparams.max_env_steps == 250
    assert resumed.model.env_steps >= 250 > first.model.env_steps
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["model"]["max_env_steps"] == 250


def test_resume_keeps_the_checkpoints_settings_and_names_them(tmp_path):
    ckpt = _ckpt(tmp_path, "--model.gamma=0.9")
    with pytest.warns(UserWarning, match=r"model\.gamma=0\.9 \(config: 0\.99\)"):  # configs/dqn_cartpole.yaml
        resumed = _fit(tmp_path, "--ckpt_path", ckpt, epochs=3)
    assert resumed.model.hparams.gamma == 0.9


@pytest.mark.parametrize("arg, match", [
    ("--model.hidden_sizes=[32, 32]", "--model.hidden_sizes=[32, 32]: the checkpoint"),
    ("--model.replay.sampler=uniform", "--model.replay.sampler='uniform': the checkpoint"),
    ("--model.dueling=true", "--model.dueling=True: the checkpoint"),
])
def test_resume_refuses_a_different_model_in_one_line(tmp_path, capsys, arg, match):
    ckpt = _ckpt(tmp_path / "first")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml"), *TINY,
                  f"--trainer.default_root_dir={tmp_path / 'second'}", "--trainer.logger=false",
                  "--ckpt_path", ckpt, arg])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert match in err and "keeps the checkpoint's model settings" in err and "Traceback" not in err
    assert not (tmp_path / "second" / "config.yaml").exists()


@pytest.mark.parametrize("kind", ["directory", "not a checkpoint"])
def test_a_ckpt_path_that_is_no_checkpoint_is_a_one_line_error(tmp_path, capsys, kind):
    path = tmp_path / "runs"
    path.mkdir()
    if kind != "directory":
        path = path / "notes.ckpt"
        path.write_bytes(b"e" * 200)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml"),
                  f"--trainer.default_root_dir={tmp_path}", "--ckpt_path", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert ("is a directory" if kind == "directory" else "is not a checkpoint") in err and "Traceback" not in err


@pytest.mark.parametrize("signum, status", [(15, 143), (2, 130)])  # SIGTERM, SIGINT (Ctrl-C): 128 + the signal
def test_a_signal_stops_the_run_with_status_128_plus_its_number(tmp_path, signum, status):
    """A SIGTERM'd or Ctrl-C'd fit is not a success: exit status 128 + the signal's number, summary.json says
    interrupted. The run is a child process (the signal must not reach pytest, whose SIGTERM handler other tests may
    have changed)."""
    import os
    import subprocess

    args = ["fit", "--config", str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml"), *TINY,
            f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.max_epochs=4",
            "--trainer.callbacks+=_interrupt_cb.SignalAt", "--trainer.callbacks.epoch=1",
            f"--trainer.callbacks.signum={signum}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "support"),
                                                        os.environ.get("PYTHONPATH", "")])}
    # Python's Ctrl-C handler, as in a terminal: a process started in the background by a non-interactive shell
    # inherits SIGINT ignored, and Python then keeps it ignored (the run would finish its epochs)
    proc = subprocess.run([sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, "
                           "signal.default_int_handler); from lightning_per.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == status, proc.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "interrupted"


def test_resuming_a_run_that_reached_its_target_trains_no_further(tmp_path):
    """A finished run (target reached) resumed with the README's command stops before its first update instead of
    training on and overwriting the solved run's checkpoint."""
    first = _fit(tmp_path, "--model.target_return=1.0", epochs=6)  # every CartPole episode returns >= 1
    assert first.trainer.current_epoch < 6  # stopped by the target
    resumed = _fit(tmp_path, "--ckpt_path", str(tmp_path / "checkpoints" / "last.ckpt"), "--model.target_return=1.0",
                   epochs=6)
    assert (resumed.model.env_steps, resumed.model.updates) == (first.model.env_steps, first.model.updates)
