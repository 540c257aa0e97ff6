"""Predictor and trainer threads of the learner process (GA3C section 4.1).

Both are daemon threads with their own stop event (the dynamic adjustment removes one by setting
it) that wait on their wake-up semaphore with a 50 ms timeout, so they notice a stop quickly.

- :class:`PredictorThread`: claims up to ``predict_batch_size`` pending requests (the prediction
  "queue" is the ``pending`` flags of the shared buffers), gathers the observations in place, runs
  one forward pass on the model device, writes actions/values/policy version back and releases each
  agent's response semaphore. One host synchronisation per batch: the agents need the actions.
- :class:`TrainerThread`: claims finished rollouts (``ready`` flags), copies each straight out of
  shared memory into its rows of the batch being assembled (pinned host memory when the model is on
  CUDA; then frees the agent's slot) until at least ``train_min_batch_size`` transitions (with
  ``train_max_batch_size``, whole-round batching: every rollout ready at a claim, up to that cap), and hands
  the batch to the learner through the bounded batch queue that ``GA3C.training_step``'s data
  loader reads.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from lightning_per.ga3c.system import GA3CSystem

__all__ = ["PredictorThread", "TrainerThread"]

log = logging.getLogger(__name__)
_POLL_S = 0.05


class _Worker(threading.Thread):
    def __init__(self, system: GA3CSystem, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.system = system
        self.stop_event = threading.Event()

    def stopped(self) -> bool:
        return self.stop_event.is_set() or self.system.stopping.is_set()

    def run(self) -> None:
        try:
            self.loop()
        except Exception as err:  # a worker that dies must not hang the run: stop everything, loudly
            log.exception("%s failed", self.name)
            self.system.fail(err)


class PredictorThread(_Worker):
    """Batches prediction requests and answers them (see the module docstring)."""

    _pinned: torch.Tensor | None = None  # (predict_batch_size, E, *obs) pinned host buffer on CUDA

    def loop(self) -> None:
        sys_ = self.system
        cuda = sys_.device.type == "cuda"
        # high priority: agents wait for these answers. It also keeps this stream out of the pool of
        # default-priority streams that CUDA-graph captures take theirs from (torch hands out pooled streams
        # round robin: a predictor on the capture's own stream would be recorded into the learner's graph)
        stream = torch.cuda.Stream(sys_.device, priority=-1) if cuda else None
        limit = sys_.cfg.predict_batch_size
        # CUDA: requests are gathered straight into this pinned buffer (one host copy, no per-batch
        # allocation); reusing it is safe because _serve waits for its stream before returning.
        self._pinned = (torch.empty((limit, *sys_.obs_rows.shape[1:]), dtype=sys_.obs_rows.dtype, pin_memory=True)
                        if cuda else None)  # [limit, E, *obs]
        while not self.stopped():
            sys_.pred_sem.acquire(timeout=_POLL_S)  # a wake-up call; we rescan on timeout anyway
            rows, agents = sys_.claim_requests(limit)
            if not agents:
                continue
            for _ in range(len(agents) - 1):  # consume the other wake-ups we just served
                if not sys_.pred_sem.acquire(block=False):
                    break
            if stream is None:
                self._serve(rows, agents)
            else:
                with torch.cuda.stream(stream):
                    self._serve(rows, agents)

    def _serve(self, rows: torch.Tensor, agents: list) -> None:
        """rows: (B,) int64 flat rows of the requested steps; agents: their handles (same order)."""
        sys_ = self.system
        if self._pinned is None:
            obs = sys_.obs_rows.index_select(0, rows)  # [B, E, *obs] on the host
        else:
            obs = torch.index_select(sys_.obs_rows, 0, rows, out=self._pinned[: rows.shape[0]])  # [B, E, *obs]
            obs = obs.to(sys_.device, non_blocking=True)  # the blocking copy of the actions below waits for it
        version = sys_.version_fn()
        action, value, *log_prob = sys_.policy(obs.flatten(0, 1))  # [B*E] each, on the model device
        action = action.view(len(agents), -1).to("cpu", torch.int64)  # sync: agents need the actions
        value = value.view(len(agents), -1).to("cpu", torch.float32)
        sys_.action_rows.index_copy_(0, rows, action)
        sys_.value_rows.index_copy_(0, rows, value)
        if sys_.cfg.vtrace:
            if not log_prob:
                raise ValueError("vtrace: the policy must return (action, value, log_prob): V-trace's importance "
                                 "weights need log mu(a|s) of the acting policy, and it returned two tensors")
            sys_.log_prob_rows.index_copy_(0, rows, log_prob[0].view(len(agents), -1).to("cpu", torch.float32))
        sys_.version_rows.index_fill_(0, rows, version)
        for agent in agents:
            agent.response_sem.release()
        sys_.stats.add_predictions(action.numel())


class TrainerThread(_Worker):
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
            sys_.train_sem.acquire(timeout=_POLL_S)  # a wake-up call; we rescan on timeout anyway
            # GA3C: what the minimum still needs; whole round: every ready rollout up to the cap
            wanted = -(-(c.train_min_batch_size - n) // per_rollout) if most == least else most - n // per_rollout
            claimed = sys_.claim_rollouts(max(1, wanted))
            for _ in range(len(claimed) - 1):
                if not sys_.train_sem.acquire(block=False):
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
