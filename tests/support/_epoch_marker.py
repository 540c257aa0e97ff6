"""A callback for tests that stop a ``lightning-per fit`` from outside: after each training epoch it writes the
number of finished epochs to a file (atomically), the signal a test waits on instead of sleeping."""

from __future__ import annotations

import os

from lightning.pytorch.callbacks import Callback


class EpochMarker(Callback):
    """Write ``<finished epochs>`` to ``path`` at every training epoch end (after the callbacks listed before it)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{trainer.current_epoch + 1}\n")
        os.replace(tmp, self.path)
