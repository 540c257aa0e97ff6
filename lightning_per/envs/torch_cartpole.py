"""A batch of CartPole-v1 environments written in plain torch, as a TorchRL ``EnvBase``.

The dynamics, thresholds, reset distribution and the 500-step time limit are those of
Gymnasium's ``CartPole-v1`` (Barto, Sutton & Anderson 1983, Euler integration, tau = 0.02 s),
so returns are comparable with the Gymnasium environment. Every tensor lives on ``device``:
on a GPU an episode never leaves the device, and :meth:`TorchCartPoleEnv.maybe_reset` resets the
finished members with ``torch.where`` instead of TorchRL's ``done.any()`` check, so
``env.step_and_maybe_reset(td)`` performs no host synchronisation.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

__all__ = ["TorchCartPoleEnv"]

_GRAVITY, _MASSCART, _MASSPOLE, _LENGTH, _FORCE, _TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
_TOTAL_MASS = _MASSCART + _MASSPOLE
_POLEMASS_LENGTH = _MASSPOLE * _LENGTH
_THETA_LIMIT = 12 * 2 * math.pi / 360  # radians
_X_LIMIT = 2.4  # metres


class TorchCartPoleEnv(EnvBase):
    """``num_envs`` CartPole-v1 environments stepped together on ``device``.

    Observation ``(num_envs, 4) float32``: cart position (m), cart velocity (m/s), pole angle (rad),
    pole angular velocity (rad/s). Action ``(num_envs,) int64`` in {0: push left, 1: push right}.
    Reward ``(num_envs, 1) float32``: 1 for every step, the terminating one included.
    ``terminated`` when |x| > 2.4 or |theta| > 12 degrees; ``truncated`` after ``max_steps`` steps.

    Args:
        num_envs: batch size (>= 1).
        device: where state, observations and actions live.
        max_steps: time limit in steps (500 for CartPole-v1).
        seed: seed of the environment's own ``torch.Generator`` (reset noise).

    Raises:
        ValueError: ``num_envs < 1`` or ``max_steps < 1``.
    """

    batch_locked = True

    def __init__(self, num_envs: int = 1, device: torch.device | str = "cpu", max_steps: int = 500,
                 seed: int = 0) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        super().__init__(device=device, batch_size=torch.Size([num_envs]))
        self.num_envs, self.max_steps = num_envs, max_steps
        n, d = num_envs, self.device
        high = torch.tensor([_X_LIMIT * 2, 3.4e38, _THETA_LIMIT * 2, 3.4e38])
        self.observation_spec = Composite(
            observation=Bounded(-high.expand(n, 4), high.expand(n, 4), shape=(n, 4), dtype=torch.float32,
                                device=d), shape=(n,), device=d)
        self.action_spec = Categorical(2, shape=(n,), dtype=torch.int64, device=d)
        self.reward_spec = Unbounded(shape=(n, 1), dtype=torch.float32, device=d)
        self.full_done_spec = Composite(
            done=Categorical(2, shape=(n, 1), dtype=torch.bool, device=d),
            terminated=Categorical(2, shape=(n, 1), dtype=torch.bool, device=d),
            truncated=Categorical(2, shape=(n, 1), dtype=torch.bool, device=d),
            shape=(n,), device=d)
        self.rng = torch.Generator(device=d)
        self.rng.manual_seed(seed)
        self.state = torch.zeros(n, 4, dtype=torch.float32, device=d)  # (x, x_dot, theta, theta_dot)
        self.steps = torch.zeros(n, dtype=torch.int64, device=d)  # steps since the last reset

    # ---------------------------------------------------------------- dynamics
    def _initial_state(self) -> Tensor:
        """(num_envs, 4) float32 on device: U(-0.05, 0.05) per coordinate, as Gymnasium."""
        u = torch.rand(self.num_envs, 4, generator=self.rng, device=self.device)
        return u * 0.1 - 0.05

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action").reshape(self.num_envs)  # [E] int64
        x, x_dot, theta, theta_dot = self.state.unbind(-1)  # each [E]
        force = torch.where(action == 1, _FORCE, -_FORCE).to(self.state.dtype)
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + _POLEMASS_LENGTH * theta_dot.square() * sin) / _TOTAL_MASS
        theta_acc = (_GRAVITY * sin - cos * temp) / (
            _LENGTH * (4.0 / 3.0 - _MASSPOLE * cos.square() / _TOTAL_MASS))
        x_acc = temp - _POLEMASS_LENGTH * theta_acc * cos / _TOTAL_MASS
        # Euler integration, exactly Gymnasium's order of updates
        x, x_dot = x + _TAU * x_dot, x_dot + _TAU * x_acc
        theta, theta_dot = theta + _TAU * theta_dot, theta_dot + _TAU * theta_acc
        self.state = torch.stack((x, x_dot, theta, theta_dot), -1)  # [E, 4]
        self.steps = self.steps + 1
        terminated = ((x.abs() > _X_LIMIT) | (theta.abs() > _THETA_LIMIT)).unsqueeze(-1)  # [E, 1]
        truncated = (self.steps >= self.max_steps).unsqueeze(-1) & ~terminated  # [E, 1]
        return TensorDict(
            observation=self.state.clone(),
            reward=torch.ones(self.num_envs, 1, dtype=torch.float32, device=self.device),
            done=terminated | truncated, terminated=terminated, truncated=truncated,
            batch_size=self.batch_size, device=self.device)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        self._masked_reset(None if mask is None else mask.reshape(self.num_envs))
        false = torch.zeros(self.num_envs, 1, dtype=torch.bool, device=self.device)
        return TensorDict(observation=self.state.clone(), done=false, terminated=false.clone(),
                          truncated=false.clone(), batch_size=self.batch_size, device=self.device)

    def _masked_reset(self, mask: Tensor | None) -> None:
        """Reset the members where ``mask`` ((num_envs,) bool) is True, all if ``mask`` is None."""
        fresh = self._initial_state()  # drawn for every member: the RNG stream is mask-independent
        if mask is None:
            self.state, self.steps = fresh, torch.zeros_like(self.steps)
        else:
            self.state = torch.where(mask.unsqueeze(-1), fresh, self.state)
            self.steps = torch.where(mask, 0, self.steps)

    def maybe_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Reset the finished members without reading ``done`` on the host (no synchronisation).

        Args:
            tensordict: the output of ``step_mdp`` (``observation (E, 4)``, ``done (E, 1) bool``...).

        Returns:
            the same tensordict with ``observation`` replaced by a fresh one and the done flags
            cleared where ``done`` was set.
        """
        done = tensordict.get("done").reshape(self.num_envs)  # [E] bool
        self._masked_reset(done)
        tensordict.set("observation", self.state.clone())
        for key in ("done", "terminated", "truncated"):
            tensordict.set(key, torch.zeros_like(tensordict.get(key)))
        return tensordict

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            self.rng.manual_seed(seed)

    # ---------------------------------------------------------------- checkpointing
    def snapshot(self) -> dict[str, Tensor]:
        """Physics state, step counters and RNG state (CPU copies) for a checkpoint."""
        return {"state": self.state.to("cpu", copy=True), "steps": self.steps.to("cpu", copy=True),
                "rng": self.rng.get_state()}

    def checked_snapshot(self, snapshot: Any) -> dict[str, Tensor]:
        """``snapshot`` checked against this env, unchanged: exactly the keys of :meth:`snapshot`, ``state``
        a finite ``(num_envs, 4) float32`` tensor, ``steps`` an ``(num_envs,) int64`` tensor in
        ``[0, max_steps]``, ``rng`` a ``uint8`` vector that a ``torch.Generator`` on this env's device takes.
        The constants (dynamics, thresholds, ``max_steps``) are never part of it.

        Raises:
            ValueError: naming the key and what was expected.
        """
        n = self.num_envs
        if not isinstance(snapshot, dict) or set(snapshot) != {"state", "steps", "rng"}:
            keys = sorted(map(str, snapshot)) if isinstance(snapshot, dict) else type(snapshot).__name__
            raise ValueError(f"env state of TorchCartPoleEnv: expected the keys ['rng', 'state', 'steps'], got {keys}")
        state, steps, rng = snapshot["state"], snapshot["steps"], snapshot["rng"]
        if not (torch.is_tensor(state) and state.dtype == torch.float32 and tuple(state.shape) == (n, 4)):
            raise ValueError(f"env state of TorchCartPoleEnv.state: expected a ({n}, 4) float32 tensor, got "
                             f"{_described(state)}")
        if not bool(torch.isfinite(state.detach().cpu()).all()):  # a checkpoint's CPU copy: no device sync
            raise ValueError("env state of TorchCartPoleEnv.state: expected finite values, got a non-finite one")
        if not (torch.is_tensor(steps) and steps.dtype == torch.int64 and tuple(steps.shape) == (n,)):
            raise ValueError(f"env state of TorchCartPoleEnv.steps: expected a ({n},) int64 tensor, got "
                             f"{_described(steps)}")
        if not bool(((steps.detach().cpu() >= 0) & (steps.detach().cpu() <= self.max_steps)).all()):
            raise ValueError(f"env state of TorchCartPoleEnv.steps: expected counts in [0, {self.max_steps}] "
                             f"(max_steps)")
        if not (torch.is_tensor(rng) and rng.dtype == torch.uint8 and rng.dim() == 1):
            raise ValueError(f"env state of TorchCartPoleEnv.rng: expected a uint8 vector (a torch.Generator's "
                             f"state), got {_described(rng)}")
        try:
            torch.Generator(device=self.device).set_state(rng.detach().cpu())
        except RuntimeError as err:
            raise ValueError(f"env state of TorchCartPoleEnv.rng: not the state of a generator on "
                             f"{self.device} ({str(err).splitlines()[0][:120]})") from None
        return snapshot

    def restore(self, snapshot: dict[str, Tensor]) -> None:
        """Inverse of :meth:`snapshot`: everything checked first (:meth:`checked_snapshot`), then set.

        Raises:
            ValueError: from :meth:`checked_snapshot`; the env is then unchanged.
        """
        snapshot = self.checked_snapshot(snapshot)
        self.state = snapshot["state"].to(self.device, copy=True)
        self.steps = snapshot["steps"].to(self.device, copy=True)
        self.rng.set_state(snapshot["rng"].detach().cpu())


def _described(value: Any) -> str:
    if torch.is_tensor(value):
        return f"a {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')} tensor"
    return type(value).__name__
