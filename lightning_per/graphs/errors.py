"""The error of the graph layer: :class:`CaptureError`."""

from __future__ import annotations

__all__ = ["CaptureError"]


class CaptureError(RuntimeError):
    """The step cannot be recorded in a CUDA graph; the message names the operation and the way out.

    Example:
        >>> from lightning_per.graphs import CaptureError
        >>> raise CaptureError("optimizer Adam was built with capturable=False: ...")
        Traceback (most recent call last):
        ...
        lightning_per.graphs.errors.CaptureError: optimizer Adam was built with capturable=False: ...
    """
