"""The open DQN module: a TorchRL env and a Q-network of the user's, without subclassing (``env_factory``,
``q_network``), through Python and through ``lightning-per fit`` with ``configs/dqn_custom.yaml``; and
``fit --help`` listing the nested config fields. CPU only; about 22 CPU-seconds in all (the CLI run is 300
updates; ``fit --help`` runs in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn
from torchrl.envs import EnvBase, GymEnv, StepCounter, TransformedEnv

from examples.custom_dqn import LayerNormMLP, cartpole_env
from lightning_per.cli import cli_main
from lightning_per.dqn import DQN, ReplayConfig

ROOT = Path(__file__).resolve().parents[2]


class _Double(nn.Module):
    """Action values in float64: against the contract (float32)."""

    def __init__(self, shape: tuple[int, ...], n: int) -> None:
        super().__init__()
        self.linear = nn.Linear(shape[0], n)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs).double()
SMALL = dict(replay=ReplayConfig(capacity=256, batch_size=16), warmup_steps=32, updates_per_epoch=8, seed=0)


def test_fit_help_lists_the_nested_replay_and_env_fields():
    out = subprocess.run([sys.executable, "-m", "lightning_per.console", "fit", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    alpha = next(i for i, line in enumerate(lines) if line.strip().startswith("--model.replay.alpha ALPHA"))
    assert "Priority exponent alpha in [0, 1]" in lines[alpha + 1]  # the field's own docstring
    for option in ("--model.replay.capacity", "--model.replay.sampler", "--model.env.id", "--model.env.num_envs",
                   "--model.env_factory", "--model.q_network"):
        assert any(line.strip().startswith(option + " ") for line in lines), option


def test_a_user_env_instance_and_q_network_class_train_and_stay_out_of_the_state_dict():
    env = cartpole_env(num_envs=2)
    model = DQN(env_factory=env, q_network=LayerNormMLP, **SMALL)
    assert isinstance(model.q_net, LayerNormMLP) and isinstance(model.target_net, LayerNormMLP)
    assert model.n_actions == 2
    assert all(k.startswith(("q_net.", "target_net.", "metrics.", "episode_returns")) for k in model.state_dict())
    assert "env_factory" not in model.hparams and "q_network" not in model.hparams  # code is never checkpoint data
    model.build_runtime("cpu")
    assert model.collector.env is env  # used as it is
    model.on_train_start()
    # 32 warm-up env steps, 2 envs per vector step: what TorchRL's StepCounter of the same env counts
    assert model.env_steps == 32 and len(model.rb) == 32 - 2 * (model.hparams.n_step - 1)


def test_a_factory_is_called_for_the_specs_and_again_for_the_run_with_the_seed():
    made: list[EnvBase] = []

    def factory() -> EnvBase:
        made.append(TransformedEnv(GymEnv("CartPole-v1", num_envs=3, categorical_action_encoding=True),
                                   StepCounter()))
        return made[-1]

    model = DQN(env_factory=factory, hidden_sizes=[16], **SMALL)
    assert len(made) == 1 and made[0].is_closed  # the probe is closed
    model.build_runtime("cpu")
    assert len(made) == 2 and model.collector.env is made[1] and model.collector.num_envs == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"env_factory": 3}, "env_factory must be a TorchRL EnvBase or a callable"),
    ({"env_factory": lambda: "CartPole-v1"}, "env_factory must return a TorchRL EnvBase, got str"),
    ({"env_factory": lambda: GymEnv("CartPole-v1", num_envs=2)}, "must have a categorical action"),
    ({"env_factory": lambda: GymEnv("CartPole-v1", categorical_action_encoding=True)}, "must have one batch dim"),
    ({"q_network": nn.Linear(4, 2)}, "q_network must be a callable (obs_shape, n_actions) -> nn.Module"),
    ({"q_network": lambda shape, n: "net"}, "must return an nn.Module, got str"),
    ({"q_network": lambda shape, n: nn.Linear(shape[0], n + 1)}, "to action values (2, 2) float32, got (2, 3)"),
    ({"q_network": lambda shape, n: nn.Linear(shape[0], n).double()}, "q_network's module fails on a zero "
                                                                       "observation batch (2, 4) torch.float32"),
    ({"q_network": _Double}, "got (2, 2) torch.float64"),
])
def test_a_broken_contract_is_one_error_naming_the_argument(kwargs, message):
    kwargs = {"env_factory": lambda: cartpole_env(num_envs=2), **kwargs}
    with pytest.raises(ValueError) as err:
        DQN(**kwargs, **SMALL)
    assert message in str(err.value)


def test_the_custom_config_trains_through_the_cli(tmp_path):
    run = cli_main(["fit", "--config", str(ROOT / "configs/dqn_custom.yaml"), "--trainer.max_epochs", "3",
                    "--model.updates_per_epoch", "100", "--model.warmup_steps", "500",
                    "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
                    "--trainer.logger.save_dir", str(tmp_path / "csv"),
                    "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"])
    model = run.model
    assert isinstance(model.q_net, LayerNormMLP) and model.q_net.head.in_features == 128
    assert isinstance(model.collector.env, TransformedEnv)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "done" and summary["updates"] == 300
    # warm-up in whole vector steps of 8 envs (ceil(500 / 8) = 63), then 1 / replay_ratio = 4 env steps per update
    assert summary["env_steps"] == 63 * 8 + 300 * 4
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert "env_factory" not in ckpt["hyper_parameters"] and "q_network" not in ckpt["hyper_parameters"]
    assert ckpt["state_dict"]["q_net.head.weight"].shape == (2, 128)
    # the run's logged settings name the user's code by class_path and init_args (the CSV logger's hparams.yaml)
    logged = yaml.safe_load(next((tmp_path / "csv").rglob("hparams.yaml")).read_text())
    assert logged["q_network"] == {"class_path": "examples.custom_dqn.LayerNormMLP",
                                   "init_args": {"width": 128, "depth": 2}}
    assert logged["env_factory"]["class_path"] == "examples.custom_dqn.cartpole_env"
    assert logged["env_factory"]["init_args"]["num_envs"] == 8


def test_the_examples_docstring_runs():
    import doctest

    import examples.custom_dqn

    result = doctest.testmod(examples.custom_dqn, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 3 and result.failed == 0
