"""Trainer threads of the learner process (GA3C section 4.1); the predictors are shared with Ape-X
(:mod:`lightning_per.actors.predictor`).

A trainer is a :class:`~lightning_per.actors.threads.WorkerThread` that waits on its wake-up semaphore with a 50 ms
timeout, so it notices a stop quickly.

- :class:`TrainerThread`: claims finished rollouts (``ready`` flags), copies each straight out of
  shared memory into its rows of the batch being assembled (pinned host memory when the model is on
  CUDA; then frees the agent's slot) until at least ``train_min_batch_size`` transitions (with
  ``train_max_batch_size``, whole-round batching: every rollout ready at a claim, up to that cap), and hands
  the batch to the learner through the bounded batch queue that ``GA3C.training_step``'s data
  loader reads.
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING

import torch

from lightning_per.actors.threads import WorkerThread

if TYPE_CHECKING:  # pragma: no cover
    pass

__all__ = ["TrainerThread"]

_POLL_S = 0.05


class TrainerThread(WorkerThread):
    """Merges rollouts into training batches (see the module docstring)."""

    def loop(self) -> None:
        sys_ = self.system
        c = sys_.cfg
        per_rollout = c.t_max * c.envs_per_agent
        least = -(-c.train_min_batch_size // per_rollout)  # whole rollouts a batch needs at least
        # claims never overshoot: a batch is `least` whole rollouts, or with whole-round batching up to `most`
        most = least if c.train_max_batch_size is None else max(least, c.train_max_batch_size // per_rollout)
        capacity = per_rollout * most
        pin = sys_.device.type == "cuda"
        batch, n = None, 0
        while not self.stopped():
            sys_.ready_sem.acquire(timeout=_POLL_S)  # a wake-up call; we rescan on timeout anyway
            # GA3C: what the minimum still needs; whole round: every ready rollout up to the cap
            wanted = -(-(c.train_min_batch_size - n) // per_rollout) if most == least else most - n // per_rollout
            claimed = sys_.claim_rollouts(max(1, wanted))
            for _ in range(len(claimed) - 1):
                if not sys_.ready_sem.acquire(block=False):
                    break
            for index, agent, slot in claimed:
                if batch is None:
                    batch = _new_batch(capacity, sys_.obs_rows.shape[2:], sys_.obs_rows.dtype, pin,
                                       c.t_max if c.vtrace else 0)
                rows = {key: t[n:n + per_rollout] for key, t in batch.items()}
                if c.vtrace:  # one s_T per env of the rollout
                    k = n // c.t_max
                    rows["next_obs"] = batch["next_obs"][k:k + c.envs_per_agent]
                if sys_.take_rollout(index, agent, slot, out=rows) is not None:  # copied straight into the batch
                    n += per_rollout
            if n >= c.train_min_batch_size:
                full = _finish(batch, n, c.t_max)
                batch, n = None, 0
                while not self.stopped():
                    try:
                        sys_.batch_q.put(full, timeout=_POLL_S)
                        break
                    except queue.Full:
                        continue


def _new_batch(n: int, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, pin: bool,
               t_max: int = 0) -> dict[str, torch.Tensor]:
    """Empty host rows for ``n`` transitions (pinned if ``pin``): ``{"obs": (n, *obs_shape) obs_dtype,
    "action": (n,) int64, "ret": (n,) float32, "version": (n,) int64}``; with ``t_max`` (V-trace: rollouts
    of T = ``t_max`` steps) also ``"log_prob"``, ``"reward"`` (n,) float32, ``"terminated"``,
    ``"truncated"`` (n,) bool and ``"next_obs"`` (n // T, *obs_shape), one s_T per env of each rollout."""
    def empty(shape, dtype):
        return torch.empty(shape, dtype=dtype, pin_memory=pin)

    rows = {"obs": empty((n, *obs_shape), obs_dtype), "action": empty(n, torch.int64),
            "ret": empty(n, torch.float32), "version": empty(n, torch.int64)}
    if t_max:
        rows.update(log_prob=empty(n, torch.float32), reward=empty(n, torch.float32),
                    terminated=empty(n, torch.bool), truncated=empty(n, torch.bool),
                    next_obs=empty((n // t_max, *obs_shape), obs_dtype))
    return rows


def _finish(rows: dict[str, torch.Tensor], n: int, t_max: int = 1) -> dict:
    """The batch of the first ``n`` filled rows (of the first ``n // t_max`` rows of ``next_obs``).

    Returns ``{"obs": (N, *obs), "action": (N,) int64, "ret": (N,) float32, "version": (N,) int64}``
    (and the V-trace keys of :func:`_new_batch`) host tensors (pinned on CUDA) plus host numbers
    ``version_mean`` (mean policy version) and ``size`` (N), so that policy lag needs no device read.
    """
    size = {key: n // t_max if key == "next_obs" else n for key in rows}
    batch: dict = {key: t if t.shape[0] == size[key] else t[:size[key]] for key, t in rows.items()}
    batch["size"] = n
    batch["version_mean"] = float(batch["version"].double().mean())
    return batch
