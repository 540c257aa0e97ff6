r"""Crash-safe Lightning checkpoints.

Lightning's ``TorchCheckpointIO`` (2.6) serialises the checkpoint in memory and writes it inside an
``fsspec`` transaction. For a local path fsspec writes to ``tempfile.mkstemp()`` -- the *system* temp
directory -- and commits with ``shutil.move``: an atomic rename only when ``/tmp`` and the run directory
share a filesystem; otherwise a copy into the final path, which a crash can leave half-written. It does not
fsync either. :class:`AtomicCheckpointIO` writes local checkpoints to a temporary file in the destination
directory, fsyncs it and ``os.replace``\ s it (see :func:`lightning_per.utils.atomic_write`); remote URLs
still go through Lightning's path.

Usage::

    trainer = Trainer(plugins=[AtomicCheckpointIO()], callbacks=[ModelCheckpoint(dirpath="runs/x/ckpt",
                      save_last=True, every_n_epochs=1)])

or, in a LightningCLI config::

    trainer:
      plugins: [{class_path: lightning_per.callbacks.AtomicCheckpointIO}]
"""

from __future__ import annotations

import os
from typing import Any

from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from lightning_per.utils import atomic_torch_save

__all__ = ["AtomicCheckpointIO"]


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are atomic and durable (temp file + fsync + ``os.replace``).

    Raises:
        TypeError: ``storage_options`` given to :meth:`save_checkpoint` (as ``TorchCheckpointIO``).

    Example::

        >>> import os, tempfile
        >>> io = AtomicCheckpointIO()  # Trainer(plugins=[AtomicCheckpointIO()])
        >>> with tempfile.TemporaryDirectory() as d:
        ...     io.save_checkpoint({"global_step": 3}, os.path.join(d, "last.ckpt"))
        ...     print(io.load_checkpoint(os.path.join(d, "last.ckpt")), os.listdir(d))  # no temp file left
        {'global_step': 3} ['last.ckpt']
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH,
                        storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path``: readers see the previous file or the complete new one."""
        if "://" in os.fspath(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"`storage_options` is not supported by {type(self).__name__}, "
                            f"got {storage_options!r}")
        atomic_torch_save(checkpoint, path)
