"""The DQN's experience from Ape-X actor processes (Horgan et al. 2018, arXiv:1803.00933), ``collector: actors``.

:class:`ApexFeed` runs :class:`lightning_per.actors.apex.ApexActors` around a copy of the online Q-network (the
actors' weights, synchronised every ``sync_interval`` updates) and moves the transitions they publish into the
replay buffer in the learner's thread, so the buffer is written and sampled by one thread:

- the actors' ingest thread puts each slot (T * E transitions) on a bounded queue; a full queue blocks it, the
  agents then block on their free slots: the actors are throttled;
- before each block of ``n`` updates the learner owes ``n / replay_ratio`` inserted transitions (the
  samples-per-insert target; ``replay_ratio`` updates per transition); it takes slots from the queue, waiting
  when none is there (the learner waits for the actors), until it has them. Each wait is timed both ways
  (``learner_wait_s``; the agents' blocking shows as a full queue, ``queue_full``);
- new transitions get the running max priority (``initial_priority="max"``) or, Ape-X's rule, their TD error
  under the current networks (``"td"``: |G + discount * Q_target(s', argmax_a Q(s', a)) - Q(s, a)|, with double
  DQN; one batched forward on the learner's device).
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from dataclasses import dataclass
from typing import Literal

import torch
from tensordict import TensorDict
from torch import nn

from lightning_per.actors.apex import ApexActors, ApexConfig
from lightning_per.actors.envs import probe_env
from lightning_per.dqn.targets import dqn_target
from lightning_per.envs.factory import EnvConfig

__all__ = ["ApexFeed", "FeedCounters", "actor_env_spec"]

_GET_POLL_S = 0.1


def actor_env_spec(env: EnvConfig) -> dict:
    """The agents' environment spec (:func:`~lightning_per.actors.envs.make_env_group`) for ``env``: the same
    observations as the learner's own env of that config. ``backend="gymnasium"``: ``gym.make(env.id)``;
    ``"ale_vector"``: ale-py's vector env with the config's frame skip, screen size, frame stack, no-op starts and
    sticky actions, one C++ thread per agent process.

    Raises:
        ValueError: another ``env.backend``.

    Example::

        >>> from lightning_per.envs.factory import EnvConfig
        >>> actor_env_spec(EnvConfig(id="CartPole-v1"))
        {'env': 'CartPole-v1', 'backend': 'gym', 'kwargs': {}}
    """
    steps = {} if env.max_episode_steps is None else {"max_episode_steps": env.max_episode_steps}
    if env.backend == "gymnasium":
        return {"env": env.id, "backend": "gym", "kwargs": steps}
    if env.backend == "ale_vector":
        frames = {} if env.max_episode_steps is None else {
            "max_num_frames_per_episode": env.max_episode_steps * env.frame_skip}  # as AleVectorEnv counts them
        return {"env": env.id, "backend": "ale_vector", "frame_stack": env.frame_stack,
                "kwargs": {"frameskip": env.frame_skip, "img_height": env.screen_size, "img_width": env.screen_size,
                           "noop_max": env.noop_max, "repeat_action_probability": env.repeat_action_probability,
                           "num_threads": 1, **frames}}
    raise ValueError(f"env.backend must be 'gymnasium' or 'ale_vector' for Ape-X actors, got {env.backend!r}")


@dataclass
class FeedCounters:
    """Host counters of the feed (read once per epoch)."""

    inserted: int = 0
    """Transitions written into the replay."""
    learner_wait_s: float = 0.0
    """Seconds the learner waited for actor transitions (acting too slow)."""
    queue_full: int = 0
    """Slots the ingest thread found the queue full for (learning too slow: actors throttled)."""
    lag_sum: float = 0.0
    """Sum over inserted transitions of (updates when inserted - version of the weights that acted)."""


class ApexFeed:
    """Ape-X actors writing into ``rb`` through the learner's thread (see the module docstring).

    Args:
        q_net: the online network (its weights are copied to the actors' network); target_net: the target network.
        rb: the replay buffer (``extend`` returns the indices, ``update_priority(index, priority)``).
        cfg: the actors (:class:`~lightning_per.actors.apex.ApexConfig`).
        env_spec: the actors' environment spec (:func:`actor_env_spec`); obs_shape: one observation's shape (the
            agents' must match).
        n_step, gamma: the learner's n-step horizon and discount (the actors' transitions follow them).
        double_dqn: TD priorities with double DQN's target.
        initial_priority: ``"max"`` (the running max) or ``"td"`` (Ape-X).
        sync_interval: updates between copies of the online weights to the actors (K >= 1).
        device: the learner's device; seed: the actors' base seed; queue_slots: slots the queue holds.

    Raises:
        ValueError: ``initial_priority`` or ``sync_interval`` out of range, the agents' observation shape other than
            ``obs_shape`` (and what ``ApexActors`` refuses).
    """

    def __init__(self, q_net: nn.Module, target_net: nn.Module, rb, cfg: ApexConfig, env_spec: dict,
                 obs_shape: tuple[int, ...], n_step: int, gamma: float, double_dqn: bool,
                 initial_priority: Literal["max", "td"], sync_interval: int, device: torch.device | str,
                 seed: int = 0, queue_slots: int = 8) -> None:
        if initial_priority not in ("max", "td"):
            raise ValueError(f"initial_priority must be 'max' or 'td', got {initial_priority!r}")
        if isinstance(sync_interval, bool) or not isinstance(sync_interval, int) or sync_interval < 1:
            raise ValueError(f"actor_sync_interval must be an int >= 1, got {sync_interval!r}")
        self.q_net, self.target_net, self.rb = q_net, target_net, rb
        self.double_dqn, self.initial_priority, self.sync_interval = double_dqn, initial_priority, sync_interval
        self.device = torch.device(device)
        self.actor_net = copy.deepcopy(q_net).requires_grad_(False).eval().to(self.device)  # q_net may not be moved yet
        self._weights_lock = threading.Lock()
        self._version = 0  # learner updates of the weights the actors use now
        self.updates = 0  # the learner's update count, as last told by sync()
        self.counters = FeedCounters()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_slots)
        self._episodes_read = 0
        shape, dtype, _ = probe_env(env_spec)  # the agents' observations: uint8 frames stay uint8 to the replay
        if tuple(shape) != tuple(obs_shape):
            raise ValueError(f"env_spec: the agents' observations have shape {tuple(shape)}, the Q-network's "
                             f"{tuple(obs_shape)}")
        self.actors = ApexActors(cfg, env_spec, obs_shape, dtype.name, n_step, gamma, self._policy,
                                 lambda: self._version, self.device, self._sink, seed=seed)

    # ---- actor side (predictor and ingest threads) ----------------------------------------------
    @torch.no_grad()
    def _policy(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self._weights_lock:
            q = self.actor_net(obs.float())  # [N, A]
        best = q.max(-1)
        return best.indices, best.values

    def _sink(self, batch: dict[str, torch.Tensor]) -> None:
        try:
            self._queue.put_nowait(batch)
            return
        except queue.Full:
            self.counters.queue_full += 1
        while not self.actors.stopping.is_set():
            try:
                self._queue.put(batch, timeout=_GET_POLL_S)
                return
            except queue.Full:
                continue

    # ---- learner side ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the actors (with the current online weights)."""
        self.sync(self.updates, force=True)
        self.actors.start()

    def sync(self, updates: int, force: bool = False) -> None:
        """Tell the feed the learner's update count; copy the online weights to the actors every
        ``sync_interval`` updates (or now, with ``force``)."""
        self.updates = updates
        if force or updates - self._version >= self.sync_interval:
            with self._weights_lock:
                for dst, src in zip(self.actor_net.parameters(), self.q_net.parameters()):
                    dst.copy_(src.detach())
                self._version = updates

    def fill(self, until: int, timeout: float | None = None) -> None:
        """Move actor slots into the replay until ``counters.inserted >= until``, waiting for the actors.

        Raises:
            RuntimeError: the actors failed or stopped (their error chained), or ``timeout`` seconds passed.
        """
        t0 = time.monotonic()
        while self.counters.inserted < until:
            try:
                batch = self._queue.get(timeout=_GET_POLL_S)
            except queue.Empty:
                if self.actors.error is not None or self.actors.stopping.is_set():
                    raise RuntimeError("the Ape-X actors stopped") from self.actors.error
                if timeout is not None and time.monotonic() - t0 > timeout:
                    raise RuntimeError(f"no actor transitions for {timeout} s") from None
                continue
            self._insert(batch)
        self.counters.learner_wait_s += time.monotonic() - t0

    @torch.no_grad()
    def _insert(self, batch: dict[str, torch.Tensor]) -> None:
        version = batch.pop("version")  # [T*E] int64
        td = TensorDict({k: v.to(self.device) for k, v in batch.items()}, batch_size=[version.shape[0]],
                        device=self.device)
        index = self.rb.extend(td)
        if self.initial_priority == "td":
            q = self.q_net(td["observation"]).gather(-1, td["action"][:, None]).squeeze(-1)  # [B]
            nxt = td["next_observation"]
            y = dqn_target(self.target_net(nxt), td["reward"], td["discount"],
                           self.q_net(nxt) if self.double_dqn else None)  # [B]
            self.rb.update_priority(index, (y - q).abs())
        self.counters.inserted += version.shape[0]
        self.counters.lag_sum += float((self.updates - version).sum())  # host tensor: no device sync

    def episodes(self) -> list[tuple[float, int, float, int]]:
        """Episodes finished since the last call: ``(seconds since start, env steps, return, length)``."""
        stats = self.actors.stats
        end = stats.episodes
        out = stats.episodes_range(self._episodes_read, end)
        self._episodes_read = end
        return out

    def close(self) -> None:
        """Stop the actors (idempotent)."""
        self.actors.close()
