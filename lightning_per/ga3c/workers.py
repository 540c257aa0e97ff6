"""Predictor and trainer threads of the learner process (GA3C section 4.1).

Both are daemon threads with their own stop event (the dynamic adjustment removes one by setting
it) that wait on their wake-up semaphore with a 50 ms timeout, so they notice a stop quickly.

- :class:`PredictorThread`: claims up to ``predict_batch_size`` pending requests (the prediction
  "queue" is the ``pending`` flags of the shared buffers), gathers the observations in place, runs
  one forward pass on the model device, writes actions/values/policy version back and releases each
  agent's response semaphore. One host synchronisation per batch: the agents need the actions.
- :class:`TrainerThread`: claims finished rollouts (``ready`` flags), copies them out of shared
  memory (then frees the agent's slot), merges them until at least ``train_min_batch_size``
  transitions and hands the batch (pinned host memory when the model is on CUDA) to the learner
  through the bounded batch queue that ``GA3C.training_step``'s data loader reads.
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

    def loop(self) -> None:
        sys_ = self.system
        cuda = sys_.device.type == "cuda"
        stream = torch.cuda.Stream(sys_.device) if cuda else None
        limit = sys_.cfg.predict_batch_size
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
        obs = sys_.obs_rows.index_select(0, rows)  # [B, E, *obs] on the host
        if sys_.device.type == "cuda":
            obs = obs.pin_memory().to(sys_.device, non_blocking=True)
        version = sys_.version_fn()
        action, value = sys_.policy(obs.flatten(0, 1))  # [B*E], [B*E] on the model device
        action = action.view(len(agents), -1).to("cpu", torch.int64)  # sync: agents need the actions
        value = value.view(len(agents), -1).to("cpu", torch.float32)
        sys_.action_rows.index_copy_(0, rows, action)
        sys_.value_rows.index_copy_(0, rows, value)
        sys_.version_rows.index_fill_(0, rows, version)
        for agent in agents:
            agent.response_sem.release()
        sys_.stats.add_predictions(action.numel())


class TrainerThread(_Worker):
    """Merges rollouts into training batches (see the module docstring)."""

    def loop(self) -> None:
        sys_ = self.system
        pending: list[dict[str, torch.Tensor]] = []
        n = 0
        while not self.stopped():
            sys_.train_sem.acquire(timeout=_POLL_S)  # a wake-up call; we rescan on timeout anyway
            per_rollout = sys_.cfg.t_max * sys_.cfg.envs_per_agent
            claimed = sys_.claim_rollouts(max(1, -(-(sys_.cfg.train_min_batch_size - n) // per_rollout)))
            for _ in range(len(claimed) - 1):
                if not sys_.train_sem.acquire(block=False):
                    break
            for index, agent, slot in claimed:
                part = sys_.take_rollout(index, agent, slot)
                if part is not None:
                    pending.append(part)
                    n += part["action"].shape[0]
            if n >= sys_.cfg.train_min_batch_size:
                batch = _merge(pending, pin=sys_.device.type == "cuda")
                pending, n = [], 0
                while not self.stopped():
                    try:
                        sys_.batch_q.put(batch, timeout=_POLL_S)
                        break
                    except queue.Full:
                        continue


def _merge(parts: list[dict[str, torch.Tensor]], pin: bool) -> dict:
    """Concatenate rollouts into one batch dict.

    Returns ``{"obs": (N, *obs), "action": (N,) int64, "ret": (N,) float32, "version": (N,) int64}``
    host tensors (pinned if ``pin``) plus host floats ``version_mean`` (mean policy version) and
    ``size`` (N), so that policy lag needs no device read.
    """
    batch: dict = {}
    for key in parts[0]:
        first = parts[0][key]
        n = sum(p[key].shape[0] for p in parts)
        out = torch.empty((n, *first.shape[1:]), dtype=first.dtype, pin_memory=pin)
        torch.cat([p[key] for p in parts], out=out)
        batch[key] = out
    batch["size"] = int(batch["action"].shape[0])
    batch["version_mean"] = float(batch["version"].double().mean())
    return batch
