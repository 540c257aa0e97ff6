"""Small helpers with no Lightning dependency: atomic file writes, JSON-safe values.

A reader (or a resumed run after a crash) sees either the old file or the complete new one, never a
partial write: data go to a temporary file in the *same directory*, are flushed and fsync'ed, then
``os.replace`` renames it over the target (atomic on POSIX and Windows within one filesystem).

``AtomicCheckpointIO`` (the Lightning ``CheckpointIO`` plugin built on :func:`atomic_write`) lives in
:mod:`lightning_per.callbacks.checkpoint_io`; this module imports nothing of the package. The CUDA-graph
helpers live in :mod:`lightning_per.graphs`.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["MAX_SEED", "NUMPY_MAX_SEED", "atomic_torch_save", "atomic_write", "atomic_write_bytes", "atomic_write_text",
           "json_safe"]


#: The largest seed NumPy's seeding (``np.random.seed``) takes, and so Lightning's ``seed_everything``.
NUMPY_MAX_SEED = 2**32 - 1

#: The largest seed the learners take (the DQN's and GA3C's ``seed``): ranks add 1000 x rank and the actors their
#: index, and every sum must stay within NumPy's seeds (0 to ``NUMPY_MAX_SEED``).
MAX_SEED = 2**31 - 1


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None],
                 before_rename: Callable[[Path], None] | None = None) -> Path:
    """Call ``write(f)`` on a temporary binary file next to ``path``, then atomically rename it to ``path``.

    Parent directories are created. On any error the temporary file is removed and ``path`` is untouched.

    Args:
        path: local destination file.
        write: writes the whole content to the file object it is given.
        before_rename: called with the temporary file's path once it is complete and fsynced, just before the
            rename (e.g. to write a manifest that lists both the current and the new content).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: ``path`` is a URL (``scheme://``) or an existing directory.
    """
    path_str = os.fspath(path)
    if "://" in path_str:
        raise ValueError(f"atomic writes need a local path, got {path_str!r}")
    target = Path(path_str)
    if target.is_dir():
        raise ValueError(f"path {path_str!r} is a directory, expected a file path")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        if hasattr(os, "fchmod"):  # mkstemp creates 0600; give the mode a plain open() would (0666 & ~umask)
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(target.parent)
    return target


def _umask() -> int:
    """The process umask, read without changing it (Linux ``/proc``); 0o022 where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _fsync_dir(directory: Path) -> None:
    """Persist the rename itself (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write(path, lambda f: f.write(text.encode(encoding)))


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save(obj, path)``, atomically: serialised in memory first, so a failing pickle leaves no file.

    Raises:
        ValueError: ``path`` is a URL or a directory.
    """
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return atomic_write(path, lambda f: f.write(buf.getbuffer()))


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +/-Inf) replaced by None, recursively through dicts,
    lists and tuples: JSON has no NaN or Infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
