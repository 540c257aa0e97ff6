"""A callback for CLI tests: raises KeyboardInterrupt (what Ctrl-C raises) at the start of an epoch."""

from lightning.pytorch import Callback


class InterruptAt(Callback):
    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise KeyboardInterrupt


class StopAfterBatch(Callback):
    """Sets ``trainer.should_stop`` after batch ``batch`` of epoch ``epoch``, as Lightning's Timer does at
    ``max_time`` (callbacks' ``on_train_batch_end`` runs before the module's)."""

    def __init__(self, epoch: int = 1, batch: int = 4) -> None:
        self.epoch, self.batch = epoch, batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            trainer.should_stop = True


class SignalAt(Callback):
    """Sends this process the signal ``signum`` (15, SIGTERM: what a cluster's preemption or `timeout` sends; 2,
    SIGINT: Ctrl-C) after batch ``batch`` of epoch ``epoch``; Lightning's SIGTERM handler turns SIGTERM into a stop,
    Python's SIGINT handler raises KeyboardInterrupt."""

    def __init__(self, epoch: int = 1, batch: int = 2, signum: int = 15) -> None:
        self.epoch, self.batch, self.signum = epoch, batch, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            import os

            os.kill(os.getpid(), self.signum)


class FailAtFitStart(Callback):
    """Raises RuntimeError in ``on_fit_start``: a failure after ``setup`` and before training starts, where
    ``Trainer.fit`` restores a checkpoint's loops and optimizer."""

    def on_fit_start(self, trainer, pl_module) -> None:
        raise RuntimeError("failed at fit start")
