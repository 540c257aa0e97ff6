"""The GA3C module's data: the stream of trainer-thread batches ``Trainer.fit`` iterates, and the callback
that stops the GA3C system when ``fit`` fails (see "Run length" in docs/ga3c.md)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch.utils.data import IterableDataset

if TYPE_CHECKING:
    from lightning_per.ga3c.module import GA3C

__all__ = ["identity", "BatchStream", "SystemGuard"]

DDP_STALL_GRACE_S = 10.0  # DDP: a rank waiting for a batch gives up this long after max_time_s


def identity(x: Any) -> Any:
    """The DataLoader's ``collate_fn``: each item already is a whole batch."""
    return x


class BatchStream(IterableDataset):
    """``updates_per_epoch`` batches from the trainer threads per epoch, each one ``updates_per_batch`` times
    in a row (across an epoch's end too); ends early (and asks the Trainer to stop) once the GA3C system stops
    or ``max_time_s`` has passed (with one process a fetch waits for a batch until the deadline at most; under
    DDP Lightning's Timer stops every rank at the same step, and a rank whose pipeline stalled gives up
    ``DDP_STALL_GRACE_S`` after the deadline)."""

    def __init__(self, module: GA3C) -> None:
        self.module = module
        self._pending: tuple[dict, int] | None = None  # a batch and its updates left when an epoch ended

    def __iter__(self):
        m = self.module
        if m.system is None:
            raise RuntimeError("GA3C system not started: iterate the train dataloader inside Trainer.fit")
        deadline = m.stats.t0 + m.cfg.max_time_s  # time.monotonic()
        single = m.trainer.world_size == 1
        yielded, per_epoch = 0, m.cfg.updates_per_epoch
        if self._pending is not None:  # the last epoch ended inside a batch's updates: finish them first
            batch, left = self._pending
            self._pending = None
            yield from self._reuse(batch, left, per_epoch)
            yielded = min(left, per_epoch)
        while yielded < per_epoch:
            left = deadline - time.monotonic()
            if single and left <= 0:
                m.bookkeeping.publish(m.system, m.episode_buffers)
                m.request_stop("max_time_s")
                return
            # DDP: Lightning's Timer stops every rank at the same step; this only ends a stalled pipeline
            batch = m.system.get_batch(timeout=left if single else max(left, 0.0) + DDP_STALL_GRACE_S)
            if batch is None:
                m.bookkeeping.publish(m.system, m.episode_buffers)
                m.request_stop("system_stopped" if m.system.stopping.is_set() else "max_time_s")
                return
            yield from self._reuse(batch, m.cfg.updates_per_batch, per_epoch - yielded)
            yielded += min(m.cfg.updates_per_batch, per_epoch - yielded)

    def _reuse(self, batch: dict, times: int, room: int):
        """``batch`` ``times`` times, at most ``room`` of them now; the rest wait for the next epoch."""
        for _ in range(min(times, room)):
            yield batch
        if times > room:
            self._pending = (batch, times - room)


class SystemGuard(Callback):
    """Stops the agents when ``fit`` fails or is interrupted (Lightning calls no module hook then)."""

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        pl_module.shutdown()
