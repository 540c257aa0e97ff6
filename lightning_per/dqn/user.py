"""A user's own TorchRL env and Q-network for the DQN module (``env_factory``, ``q_network``): their contracts,
checked once when the module is built, and :class:`UserEnv`, the holder of the env source."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torchrl.data import Categorical
from torchrl.envs import EnvBase

__all__ = ["UserEnv", "check_user_env", "check_user_objects", "user_q_network"]


@dataclass(frozen=True)
class UserEnv:
    """Where a user's env comes from: ``source`` is an ``EnvBase`` (used as it is, never closed by us) or a
    callable returning one (a new env at each :meth:`make`). A plain holder, so that an ``EnvBase`` given to the
    module is no submodule of it (its buffers stay out of the module's ``state_dict`` and ``.to()``)."""

    source: Any

    @property
    def owned(self) -> bool:
        """:meth:`make` returns a new env, which its caller closes."""
        return not isinstance(self.source, EnvBase)

    def make(self, seed: int) -> EnvBase:
        """The env, seeded with ``env.set_seed(seed)``.

        Raises:
            ValueError: the factory returned something other than a TorchRL ``EnvBase``.
        """
        env = self.source() if self.owned else self.source
        if not isinstance(env, EnvBase):
            raise ValueError(f"env_factory must return a TorchRL EnvBase, got {type(env).__name__}")
        env.set_seed(seed)
        return env


def check_user_objects(env_factory: Any, q_network: Any) -> None:
    """Refuse a user's ``env_factory`` that is neither a TorchRL ``EnvBase`` nor callable, and a ``q_network``
    that is not callable (an ``nn.Module`` instance is refused too: the DQN builds its online and target networks
    from a factory, ``q_network(obs_shape, n_actions)``).

    Raises:
        ValueError: naming the argument and what it must be.
    """
    if env_factory is not None and not isinstance(env_factory, EnvBase) and not callable(env_factory):
        raise ValueError(f"env_factory must be a TorchRL EnvBase or a callable returning one (a class_path in "
                         f"YAML), got {type(env_factory).__name__}")
    if q_network is not None and (isinstance(q_network, nn.Module) or not callable(q_network)):
        raise ValueError(f"q_network must be a callable (obs_shape, n_actions) -> nn.Module, e.g. a module class "
                         f"through class_path, not {type(q_network).__name__}")


def check_user_env(env: EnvBase) -> tuple[tuple[int, ...], int]:
    """The observation shape (without the batch dim) and the number of actions of a user's TorchRL env, after
    checking the contract the DQN's collector relies on: ``batch_size == (E,)``, an ``observation`` entry and a
    categorical ``action`` (``Categorical(n)``: ``(E,) int64``; ``GymEnv(..., categorical_action_encoding=True)``).

    Raises:
        ValueError: naming the part of the contract the env breaks.
    """
    if len(env.batch_size) != 1:
        raise ValueError(f"env_factory's env must have one batch dim (E,), e.g. GymEnv(..., num_envs=E), got "
                         f"batch_size {tuple(env.batch_size)}")
    if "observation" not in env.observation_spec.keys():
        raise ValueError(f"env_factory's env must have an 'observation' entry, got "
                         f"{sorted(map(str, env.observation_spec.keys()))}")
    action = env.action_spec
    if not isinstance(action, Categorical):
        raise ValueError(f"env_factory's env must have a categorical action (Categorical(n); for Gymnasium "
                         f"GymEnv(..., categorical_action_encoding=True)), got {type(action).__name__}")
    return tuple(env.observation_spec["observation"].shape[1:]), int(action.space.n)


def user_q_network(q_network: Callable[[tuple[int, ...], int], nn.Module], obs_shape: Sequence[int],
                   n_actions: int, observation: Tensor) -> nn.Module:
    """Build a user's Q-network, ``q_network(obs_shape, n_actions)``, and check its contract on ``observation``.

    The contract: an ``nn.Module`` mapping observations ``(B, *obs_shape)`` (the env's dtype, on the module's
    device) to action values ``(B, n_actions)`` float32, with no state other than parameters and buffers (the
    DQN deep-copies it into the target network; a checkpoint holds its ``state_dict``).

    Args:
        q_network: the factory (a module class, or a function).
        obs_shape: one observation's shape.
        n_actions: number of discrete actions A.
        observation: ``(E, *obs_shape)`` a zero observation batch from the env's spec (CPU).

    Raises:
        ValueError: the factory did not return an ``nn.Module``, its module fails on ``observation``, or its
            output is not ``(E, A)`` float32.
    """
    net = q_network(tuple(int(s) for s in obs_shape), int(n_actions))
    if not isinstance(net, nn.Module):
        raise ValueError(f"q_network(obs_shape, n_actions) must return an nn.Module, got {type(net).__name__}")
    try:
        with torch.no_grad():
            out = net(observation)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ValueError(f"q_network's module fails on a zero observation batch {tuple(observation.shape)} "
                         f"{observation.dtype}: {type(err).__name__}: {str(err).splitlines()[0]}") from err
    want = (observation.shape[0], int(n_actions))
    if not isinstance(out, Tensor) or tuple(out.shape) != want or out.dtype != torch.float32:
        got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"q_network's module must map observations {tuple(observation.shape)} to action values "
                         f"{want} float32, got {got}")
    return net
