"""Experience collection: epsilon-greedy steps in a batched TorchRL env, emitted as n-step transitions.

Every vector step of ``E`` environments emits exactly ``E`` transitions (after the first
``n - 1`` steps): the transition that started ``n - 1`` steps ago, with its return truncated at the
end of its episode (:func:`lightning_per.dqn.targets.n_step_return`). The size never depends on
data, so a step on a device-resident env (``TorchCartPoleEnv`` on a GPU) needs no host
synchronisation. The env must reset finished members in ``step_and_maybe_reset`` while reporting
the true final observation in ``("next", "observation")`` (TorchRL's convention), so every
stored transition is a real one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor
from torchrl.envs import EnvBase

from lightning_per.dqn.targets import n_step_return
from lightning_per.envs import restore_env, snapshot_env

__all__ = ["NStepCollector", "StepOutput"]


@dataclass
class StepOutput:
    """What one vector step produced; all tensors on the collector's device.

    Attributes:
        transitions: TensorDict ``[E]`` with ``observation``, ``action (E,) int64``,
            ``reward (E,) float32`` (n-step return), ``discount (E,) float32`` and
            ``next_observation`` (the bootstrap observation); None during the first ``n - 1`` steps.
        done: ``(E,) bool``, an episode ended at this step.
        episode_return: ``(E,) float32``, undiscounted return of the episode that ended (0 elsewhere).
        episode_length: ``(E,) float32``, its length in steps (0 elsewhere).
    """

    transitions: TensorDictBase | None
    done: Tensor
    episode_return: Tensor
    episode_length: Tensor


@dataclass
class _Received:
    """One vector step's results, not yet in the window (device tensors, ``E`` members): the observation
    acted on and the action, then what the env returned."""

    observation: Tensor
    action: Tensor
    next_observation: Tensor
    reward: Tensor
    done: Tensor
    terminated: Tensor


def steps_in_threads(env: EnvBase) -> bool:
    """``env``'s class defines ``step_async`` and ``step_wait`` (see :attr:`NStepCollector.overlaps`)."""
    return all(callable(getattr(type(env), name, None)) for name in ("step_async", "step_wait"))


class NStepCollector:
    """Steps ``env`` with epsilon-greedy actions and keeps a window of the last ``n_step`` steps.

    Args:
        env: a batched TorchRL env (``batch_size == (E,)``), categorical ``action``.
        n_step: return horizon n >= 1.
        gamma: discount factor.
        n_actions: number of discrete actions A.
        device: where the window, the transitions and the exploration RNG live (the learner's).
        seed: seed of the exploration ``torch.Generator``.
    """

    def __init__(self, env: EnvBase, n_step: int, gamma: float, n_actions: int,
                 device: torch.device | str, seed: int = 0) -> None:
        self.env, self.n, self.gamma, self.n_actions = env, n_step, gamma, n_actions
        self.device = torch.device(device)
        self.num_envs = int(env.batch_size[0])
        self._overlaps = steps_in_threads(env)  # read at every step: the env's class does not change
        self.rng = torch.Generator(device=self.device)
        self.rng.manual_seed(seed)
        self.steps = 0  # vector steps taken (host int, never read from the device)
        self._td: TensorDictBase | None = None  # the env's current tensordict (env device)
        self._win: dict[str, Tensor] = {}
        self._ep_return = torch.zeros(self.num_envs, dtype=torch.float32, device=self.device)
        self._ep_length = torch.zeros(self.num_envs, dtype=torch.float32, device=self.device)
        self._sent: tuple[Tensor, Tensor, tuple[TensorDictBase, TensorDictBase] | None] | None = None
        self._received: _Received | None = None  # waited for, not yet recorded (a checkpoint drained it)

    def _ensure_started(self) -> None:
        if self._td is None:
            self._td = self.env.reset()

    def _alloc_window(self, obs: Tensor) -> None:
        n, e, d = self.n, self.num_envs, self.device
        self._win = {
            "observation": torch.zeros((n, *obs.shape), dtype=obs.dtype, device=d),
            "next_observation": torch.zeros((n, *obs.shape), dtype=obs.dtype, device=d),
            "action": torch.zeros(n, e, dtype=torch.int64, device=d),
            "reward": torch.zeros(n, e, dtype=torch.float32, device=d),
            "done": torch.zeros(n, e, dtype=torch.bool, device=d),
            "terminated": torch.zeros(n, e, dtype=torch.bool, device=d),
        }

    @torch.no_grad()
    def act(self, obs: Tensor, q_fn: Callable[[Tensor], Tensor] | None, epsilon: float) -> Tensor:
        """Epsilon-greedy actions ``(E,) int64`` on the collector device.

        Args:
            obs: ``(E, *obs_shape)`` on the collector device.
            q_fn: ``obs -> (E, A)`` action values; None means uniformly random actions.
            epsilon: probability of a uniformly random action (host float).
        """
        e, d = self.num_envs, self.device
        random_action = torch.randint(self.n_actions, (e,), generator=self.rng, device=d)
        explore = torch.rand(self.num_envs, generator=self.rng, device=self.device) < epsilon  # [E]
        if q_fn is None:
            return random_action
        greedy = q_fn(obs).argmax(-1)  # [E]
        return torch.where(explore, random_action, greedy)

    @property
    def overlaps(self) -> bool:
        """The env steps in its own threads between :meth:`start` and :meth:`wait`: its class defines
        ``step_async(action)`` and ``step_wait() -> (next, root)``, as
        :class:`~lightning_per.envs.atari.AleVectorEnv` does. Looked up on the class: TorchRL's wrappers
        forward unknown attributes to the env they wrap, and a wrapped Gymnasium ``AsyncVectorEnv`` has
        methods of those names with another contract."""
        return self._overlaps

    @property
    def in_flight(self) -> bool:
        """A step was started (:meth:`start`) and not yet recorded (:meth:`record`)."""
        return self._sent is not None or self._received is not None

    @torch.no_grad()
    def step(self, q_fn: Callable[[Tensor], Tensor] | None, epsilon: float) -> StepOutput:
        """One vector step (``E`` env steps), start to end; see :class:`StepOutput`."""
        self.start(q_fn, epsilon)
        return self.record(self.wait())

    @torch.no_grad()
    def start(self, q_fn: Callable[[Tensor], Tensor] | None, epsilon: float) -> None:
        """Act on the current observations and start the env step (which an env with ``step_async`` runs
        in its own threads until :meth:`wait`; any other env steps here).

        Raises:
            RuntimeError: a step started earlier has not been waited for.
        """
        if self._sent is not None or self._received is not None:
            raise RuntimeError("NStepCollector.start: the previous step was not waited for (call wait())")
        self._ensure_started()
        td = self._td
        obs = self._to_device(td.get("observation"))  # [E, *obs]
        action = self.act(obs, q_fn, epsilon)  # [E]
        # a CPU env needs its actions on the host: the one synchronisation of a step on such an env
        host_action = action.to(self.env.device or "cpu").reshape(td.batch_size)
        if self.overlaps:
            self.env.step_async(host_action)
            self._sent = (obs, action, None)
        else:
            td.set("action", host_action)
            out, root = self.env.step_and_maybe_reset(td)
            self._sent = (obs, action, (out.get("next"), root))

    @torch.no_grad()
    def wait(self) -> _Received:
        """The results of the step :meth:`start` began (waiting for the env if it is still stepping); the
        collector moves on to the observations they end in, so the next :meth:`start` may come before
        :meth:`record` of these.

        Returns, on the collector's device (``E`` members): ``observation (E, *obs)`` (acted on),
        ``action (E,) int64``, ``next_observation (E, *obs)`` (the true final one where an episode ended),
        ``reward (E,) float32``, ``done`` and ``terminated`` ``(E,) bool``.

        Raises:
            RuntimeError: no step was started.
        """
        if self._received is not None:  # drained by state_dict() or restored by load_state_dict()
            received, self._received = self._received, None
            return received
        if self._sent is None:
            raise RuntimeError("NStepCollector.wait: no step was started (call start())")
        obs, action, result = self._sent
        nxt, root = self.env.step_wait() if result is None else result
        self._sent, self._td = None, root
        e = self.num_envs
        return _Received(
            observation=obs, action=action,
            next_observation=self._to_device(nxt.get("observation")),
            reward=self._to_device(nxt.get("reward").reshape(e)).to(torch.float32),
            done=self._to_device(nxt.get("done").reshape(e)),
            terminated=self._to_device(nxt.get("terminated").reshape(e)))

    @torch.no_grad()
    def record(self, received: _Received) -> StepOutput:
        """Put a step's results (:meth:`wait`) into the n-step window; the transition that completes."""
        if not self._win:
            self._alloc_window(received.observation)
        slot = self.steps % self.n
        w = self._win
        w["observation"][slot] = received.observation
        w["next_observation"][slot] = received.next_observation
        w["action"][slot] = received.action
        w["reward"][slot] = received.reward
        w["done"][slot] = received.done
        w["terminated"][slot] = received.terminated
        self.steps += 1

        # episode bookkeeping (device, in place, no syncs)
        reward, done = received.reward, received.done
        self._ep_return += reward
        self._ep_length += 1
        ep_return = torch.where(done, self._ep_return, 0.0)
        ep_length = torch.where(done, self._ep_length, 0.0)
        self._ep_return.masked_fill_(done, 0.0)
        self._ep_length.masked_fill_(done, 0.0)
        return StepOutput(self._emit(), done, ep_return, ep_length)

    def _to_device(self, x: Tensor) -> Tensor:
        """Host tensors go to a CUDA device through pinned memory, without blocking the host."""
        if x.device == self.device:
            return x
        if self.device.type == "cuda" and x.device.type == "cpu":
            return x.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device)

    def _emit(self) -> TensorDictBase | None:
        """The transition that started ``n - 1`` steps ago, or None while the window fills."""
        if self.steps < self.n:
            return None
        w, start = self._win, self.steps % self.n  # oldest slot of the window
        order = lambda x: torch.cat((x[start:], x[:start])) if start else x  # noqa: E731 [n, E, ...]
        ret, discount, last = n_step_return(order(w["reward"]), order(w["done"]), order(w["terminated"]),
                                            self.gamma)
        slot = (last + start) % self.n  # [E] window slot of the last step in the episode
        env_idx = torch.arange(self.num_envs, device=self.device)
        return TensorDict({
            "observation": w["observation"][start].clone(),
            "action": w["action"][start].clone(),
            "reward": ret,
            "discount": discount,
            "next_observation": w["next_observation"][slot, env_idx],
        }, batch_size=[self.num_envs], device=self.device)

    # ---------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Window, counters, episode accumulators, exploration RNG, env state and a step waited for but not
        recorded (CPU tensors). A step in flight is waited for first."""
        if self._sent is not None:  # a step in flight: wait for it; the results are kept for record()
            self._received = self.wait()
        copy = lambda t: t.detach().to("cpu", copy=True)  # noqa: E731 (a snapshot, also on the CPU)
        received = self._received
        return {
            "received": None if received is None else {k: copy(v) for k, v in vars(received).items()},
            "steps": self.steps,
            "td": None if self._td is None else self._td.apply(copy).to_dict(),
            "window": {k: copy(v) for k, v in self._win.items()},
            "ep_return": copy(self._ep_return), "ep_length": copy(self._ep_length),
            "rng": self.rng.get_state(),
            "env": snapshot_env(self.env),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`; the env state is restored where it was captured."""
        self.steps = int(state["steps"])
        self._win = {k: v.to(self.device) for k, v in state["window"].items()}
        self._ep_return = state["ep_return"].to(self.device)
        self._ep_length = state["ep_length"].to(self.device)
        self.rng.set_state(state["rng"])
        received = state.get("received")
        self._sent = None
        self._received = None if received is None else _Received(**{k: v.to(self.device) for k, v in received.items()})
        if state["td"] is None:
            self._td = None
            return
        if restore_env(self.env, state["env"]):
            self._td = TensorDict.from_dict(state["td"], batch_size=self.env.batch_size,
                                            device=self.env.device)
        else:  # start new episodes; the partial ones in the window end (truncated) at its last step
            self._received = None  # a step of those episodes that was not recorded yet is dropped
            self._td = self.env.reset()
            if self._win and self.steps > 0:
                self._win["done"][(self.steps - 1) % self.n] = True
            self._ep_return.zero_()
            self._ep_length.zero_()
