"""Predictor threads of the learner process (GA3C section 4.1; Ape-X's batched acting).

:class:`PredictorThread` claims up to ``predict_batch_size`` pending requests (the prediction "queue" is the
``pending`` flags of the shared buffers), gathers the observations in place, runs one forward pass on the model
device, writes actions/values/policy version back and releases each agent's response semaphore. One host
synchronisation per batch: the agents need the actions.

The system it serves (GA3C's :class:`~lightning_per.ga3c.system.GA3CSystem`, Ape-X's
:class:`~lightning_per.actors.apex.ApexActors`) holds: ``predict_batch_size``, ``records_log_prob``,
``claim_requests(limit) -> (rows (B,) int64, agent handles)``, the shared host views ``obs_rows`` [R, E, *obs],
``action_rows``/``value_rows`` [R, E], ``version_rows`` [R] (and ``log_prob_rows`` when ``records_log_prob``),
``policy(obs) -> (action, value[, log_prob])``, ``version_fn()``, ``device``, ``pred_sem``, ``stats``, ``stopping``
and ``fail(error)``.
"""

from __future__ import annotations

import torch

from lightning_per.actors.threads import WorkerThread

__all__ = ["PredictorThread"]

_POLL_S = 0.05


class PredictorThread(WorkerThread):
    """Batches prediction requests and answers them (see the module docstring)."""

    _pinned: torch.Tensor | None = None  # (predict_batch_size, E, *obs) pinned host buffer on CUDA

    def loop(self) -> None:
        sys_ = self.system
        cuda = sys_.device.type == "cuda"
        # high priority: agents wait for these answers. It also keeps this stream out of the pool of
        # default-priority streams that CUDA-graph captures take theirs from (torch hands out pooled streams
        # round robin: a predictor on the capture's own stream would be recorded into the learner's graph)
        stream = torch.cuda.Stream(sys_.device, priority=-1) if cuda else None
        limit = sys_.predict_batch_size
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
        if sys_.records_log_prob:
            if not log_prob:
                raise ValueError("vtrace: the policy must return (action, value, log_prob): V-trace's importance "
                                 "weights need log mu(a|s) of the acting policy, and it returned two tensors")
            sys_.log_prob_rows.index_copy_(0, rows, log_prob[0].view(len(agents), -1).to("cpu", torch.float32))
        sys_.version_rows.index_fill_(0, rows, version)
        for agent in agents:
            agent.response_sem.release()
        sys_.stats.add_predictions(action.numel())
