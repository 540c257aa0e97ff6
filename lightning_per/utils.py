"""Small helpers with no Lightning dependency: atomic file writes, CUDA-graph capture.

A reader (or a resumed run after a crash) sees either the old file or the complete new one, never a
partial write: data go to a temporary file in the *same directory*, are flushed and fsync'ed, then
``os.replace`` renames it over the target (atomic on POSIX and Windows within one filesystem).

``AtomicCheckpointIO`` (the Lightning ``CheckpointIO`` plugin built on :func:`atomic_torch_save`) lives in
:mod:`lightning_per.callbacks.checkpoint_io` and is re-exported here lazily, so importing this module does
not import Lightning.
"""

from __future__ import annotations

import contextlib
import gc
import io
import math
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

# AtomicCheckpointIO is also importable from here (lazily, see __getattr__ at the bottom).
__all__ = ["atomic_torch_save", "atomic_write", "atomic_write_bytes", "atomic_write_text", "capture_cuda_graph",
           "cuda_graph_capture", "gc_paused", "json_safe", "warm_up_on_side_stream"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(f)`` on a temporary binary file next to ``path``, then atomically rename it to ``path``.

    Parent directories are created. On any error the temporary file is removed and ``path`` is untouched.

    Args:
        path: local destination file.
        write: writes the whole content to the file object it is given.

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


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's garbage collector off for the block (its previous state restored after). Around CUDA-graph
    captures (:func:`cuda_graph_capture`): a collection inside one can run finalizers that free CUDA or pinned
    memory of unrelated objects, calls a capture forbids from its own thread ("operation failed due to a
    previous error during capture"). Collections are only deferred to the end of the block. The switch is
    process-wide: do not nest it across threads (the first thread to leave would turn collection back on)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def cuda_graph_capture(graph: Any, generators: Sequence[Any] = (), **graph_kwargs: Any) -> Iterator[None]:
    """Record the block's CUDA work into ``graph`` (a ``torch.cuda.CUDAGraph``): ``generators`` (CUDA
    ``torch.Generator`` objects the block draws from) are registered with it first, so each replay draws new
    numbers; the block runs under ``torch.cuda.graph(graph, **graph_kwargs)`` (e.g. ``pool``,
    ``capture_error_mode``) with Python's GC paused (:func:`gc_paused`). ``torch.cuda.graph`` synchronises the
    device and empties the caching allocator before it records."""
    import torch

    for gen in generators:
        graph.register_generator_state(gen)
    with gc_paused(), torch.cuda.graph(graph, **graph_kwargs):
        yield


_EAGER_GRAPHS_PAUSED = threading.local()


@contextlib.contextmanager
def eager_graphs_paused() -> Iterator[None]:
    """Within (this thread only): the samplers' cached CUDA graphs (``eager_graphs``) neither record nor
    replay; eager calls launch their kernels. :func:`warm_up_on_side_stream` uses it: a warm-up before a
    capture is about to record those calls itself, so caching them would only cost a sync and memory."""
    _EAGER_GRAPHS_PAUSED.depth = getattr(_EAGER_GRAPHS_PAUSED, "depth", 0) + 1
    try:
        yield
    finally:
        _EAGER_GRAPHS_PAUSED.depth -= 1


def eager_graphs_are_paused() -> bool:
    """Whether this thread is inside :func:`eager_graphs_paused`."""
    return getattr(_EAGER_GRAPHS_PAUSED, "depth", 0) > 0


def warm_up_on_side_stream(fn: Callable[[], Any], iters: int, device: Any = None) -> None:
    """``iters`` calls of ``fn`` on a new side stream of ``device`` (default: the current CUDA device), after
    the work already queued on the current stream and before any queued later: torch's warm-up before a
    capture (allocator, cuBLAS, Triton and ``torch.compile`` first calls run outside the graph). The
    samplers' cached graphs are paused meanwhile (:func:`eager_graphs_paused`)."""
    import torch

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), eager_graphs_paused():  # the capture that follows records these calls
        for _ in range(iters):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)


def capture_cuda_graph(fn: Callable[[], Any], generators: Sequence[Any] = (), warmup: int = 3) -> Any:
    """Capture one call of ``fn`` in a ``torch.cuda.CUDAGraph`` and return the graph (``graph.replay()``
    reruns it). torch's recipe: ``warmup`` eager calls on a side stream first
    (:func:`warm_up_on_side_stream`), then the capture (:func:`cuda_graph_capture`). ``generators``: custom
    ``torch.Generator`` objects ``fn`` draws from, registered with the graph so every replay draws new
    numbers. CUDA only (current device)."""
    import torch

    warm_up_on_side_stream(fn, warmup)
    graph = torch.cuda.CUDAGraph()
    with cuda_graph_capture(graph, generators):
        fn()
    return graph


def __getattr__(name: str) -> Any:
    if name == "AtomicCheckpointIO":
        from lightning_per.callbacks.checkpoint_io import AtomicCheckpointIO

        return AtomicCheckpointIO
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
