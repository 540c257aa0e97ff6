"""A callback for CLI tests: raises KeyboardInterrupt (what Ctrl-C raises) at the start of an epoch."""

from lightning.pytorch import Callback


class InterruptAt(Callback):
    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise KeyboardInterrupt
