r"""Crash-safe Lightning checkpoints.

Lightning's ``TorchCheckpointIO`` (2.6) serialises the checkpoint in memory and writes it inside an
``fsspec`` transaction. For a local path fsspec writes to ``tempfile.mkstemp()`` -- the *system* temp
directory -- and commits with ``shutil.move``: an atomic rename only when ``/tmp`` and the run directory
share a filesystem; otherwise a copy into the final path, which a crash can leave half-written. It does not
fsync either. :class:`AtomicCheckpointIO` writes local checkpoints to a temporary file in the destination
directory, fsyncs it and ``os.replace``\ s it (see :func:`lightning_per.utils.atomic_write`), then writes its
manifest ``<file>.manifest.json`` (size, SHA-256, generation id: :mod:`lightning_per.integrity`); leftovers of an
interrupted save are removed at the next save. :meth:`AtomicCheckpointIO.load_checkpoint` verifies the manifest
first and loads with ``weights_only=True``: a damaged, truncated or unsealed checkpoint is refused in one line
naming the file. Remote URLs still go through Lightning's path.

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

from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from lightning_per.integrity import (
    IntegrityError,
    file_manifest_path,
    load_torch_file,
    new_generation,
    save_torch_file,
)

__all__ = ["AtomicCheckpointIO", "CHECKPOINT_KIND", "GENERATION_KEY"]

#: The manifest kind of a Lightning checkpoint.
CHECKPOINT_KIND = "checkpoint"
#: Top-level checkpoint key a module may set (``on_save_checkpoint``) to the generation id that its other parts
#: (e.g. DDP replay shards) carry too; a fresh id otherwise.
GENERATION_KEY = "lightning_per_generation"


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are atomic, durable and sealed by a manifest, and whose local
    loads verify it (see the module docstring).

    Raises:
        TypeError: ``storage_options`` given to :meth:`save_checkpoint` (as ``TorchCheckpointIO``).
        IntegrityError: (a ValueError, from :meth:`load_checkpoint`) the checkpoint does not match its manifest.

    Example::

        >>> import os, tempfile
        >>> from lightning_per.callbacks import AtomicCheckpointIO
        >>> io = AtomicCheckpointIO()  # Trainer(plugins=[AtomicCheckpointIO()])
        >>> with tempfile.TemporaryDirectory() as d:
        ...     io.save_checkpoint({"global_step": 3}, os.path.join(d, "last.ckpt"))
        ...     print(io.load_checkpoint(os.path.join(d, "last.ckpt")), sorted(os.listdir(d)))  # no temp file left
        {'global_step': 3} ['last.ckpt', 'last.ckpt.manifest.json']
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path``: readers see the previous file or the complete new one."""
        if "://" in os.fspath(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"`storage_options` is not supported by {type(self).__name__}, "
                            f"got {storage_options!r}")
        generation = checkpoint.get(GENERATION_KEY) if isinstance(checkpoint, dict) else None
        meta = {k: checkpoint.get(k) for k in ("epoch", "global_step") if isinstance(checkpoint.get(k), int)}
        save_torch_file(checkpoint, path, CHECKPOINT_KIND, generation if isinstance(generation, str)
                        else new_generation(), meta)

    @override
    def load_checkpoint(self, path: str | os.PathLike[str], map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint at ``path`` once it matches its manifest, loaded with ``weights_only=True``.

        Raises:
            FileNotFoundError: no file at ``path``.
            IntegrityError: no manifest, or the file is truncated or damaged (the message names it).
        """
        if "://" in os.fspath(path):
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        checkpoint, _ = load_torch_file(path, CHECKPOINT_KIND, map_location=map_location)
        if not isinstance(checkpoint, dict):
            raise IntegrityError(f"{path}: not a Lightning checkpoint (a {type(checkpoint).__name__})")
        return checkpoint

    @override
    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Remove the checkpoint and its manifest."""
        super().remove_checkpoint(path)
        if "://" not in os.fspath(path):
            try:
                os.remove(file_manifest_path(path))
            except FileNotFoundError:
                pass
