"""A TorchRL env and a Q-network of your own, trained by the DQN module without subclassing it.

``configs/dqn_custom.yaml`` names the two functions below by ``class_path``::

    PYTHONPATH=. lightning-per fit --config configs/dqn_custom.yaml

(``PYTHONPATH=.``: the console command imports ``examples.custom_dqn`` from the current directory.) In Python::

    >>> from lightning_per.dqn import DQN, ReplayConfig
    >>> model = DQN(env_factory=lambda: cartpole_env(num_envs=2), q_network=LayerNormMLP,
    ...             replay=ReplayConfig(capacity=256, batch_size=16), warmup_steps=32, updates_per_epoch=8)
    >>> model.q_net(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchrl.envs import Compose, EnvBase, GymEnv, ObservationNorm, StepCounter

__all__ = ["LayerNormMLP", "cartpole_env"]


def cartpole_env(num_envs: int = 8, max_steps: int = 200, obs_scale: float = 0.5) -> EnvBase:
    """Gymnasium's CartPole-v1, ``num_envs`` copies in one TorchRL ``GymEnv``, with TorchRL transforms: a step
    limit (``StepCounter``: truncation after ``max_steps``) and a fixed observation scaling
    (``ObservationNorm``: ``obs * obs_scale``). Observation ``(num_envs, 4) float32``, categorical action."""
    env = GymEnv("CartPole-v1", num_envs=num_envs, categorical_action_encoding=True)
    return env.append_transform(Compose(StepCounter(max_steps=max_steps),
                                        ObservationNorm(loc=0.0, scale=obs_scale, in_keys=["observation"])))


class LayerNormMLP(nn.Module):
    """A Q-network by the DQN's contract: ``(obs_shape, n_actions, ...)`` -> a module mapping
    ``(B, *obs_shape)`` observations to ``(B, n_actions)`` float32 action values; here Linear -> LayerNorm ->
    SiLU blocks of ``width`` units, ``depth`` times."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, width: int = 128, depth: int = 2) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        n_in = int(torch.tensor(obs_shape).prod())
        for _ in range(depth):
            layers += [nn.Linear(n_in, width), nn.LayerNorm(width), nn.SiLU()]
            n_in = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(n_in, n_actions)

    def forward(self, obs: Tensor) -> Tensor:
        return self.head(self.body(obs.flatten(1).to(torch.float32)))  # [B, A]
