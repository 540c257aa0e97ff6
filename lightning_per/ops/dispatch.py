"""Backend selection for the replay ops: the compiled kernels (:class:`lightning_per.ops.kernels.KernelOps`)
when they build and pass a self-check against :mod:`lightning_per.ops.reference`, the reference otherwise.

A sampler calls :func:`select_backend` once, at construction (no device branches in hot methods). A
fallback is announced once with :func:`warnings.warn`.
"""

from __future__ import annotations

import warnings
from types import ModuleType

import torch

from lightning_per.ops import reference
from lightning_per.ops.protocol import CompiledReplayOps, ReplayOps

__all__ = ["select_backend", "make_kernel_ops", "load_ext"]

_WARNED: set[str] = set()
_CHECKED: dict[str, ReplayOps | None] = {}


def load_ext() -> ModuleType | None:
    """The compiled-kernel package ``lightning_per.ext`` (sources in the top-level ``ext/``), or None when it
    is not installed. Imports no Triton (its kernel modules do)."""
    try:
        import lightning_per.ext as ext
    except ImportError:
        return None
    return ext


def make_kernel_ops(device: torch.device | str) -> CompiledReplayOps:
    """The compiled replay ops for ``device``, self-checked against the reference before they are returned.

    Args:
        device: a CUDA device (or CPU when Triton runs under ``TRITON_INTERPRET=1``).

    Returns:
        A :class:`lightning_per.ops.kernels.KernelOps`: every name of :mod:`lightning_per.ops.reference` (same
        signatures), ``COMPILED`` (the names that run kernels) and the helpers
        ``new_rng_state``, ``seed_word``, ``DEVICE_RNG_DRAWS``.

    Raises:
        RuntimeError: the device is not supported, Triton or a kernel fails to build, or a kernel's result
            differs from the reference (the message names the op).
    """
    device = torch.device(device)
    try:
        from lightning_per.ops.kernels import KernelOps  # imports triton: may raise
    except Exception as err:  # noqa: BLE001 - a broken Triton must turn into the documented RuntimeError
        raise RuntimeError(f"importing the Triton kernels failed: {err!r}") from err
    from lightning_per.ops.selfcheck import self_check

    ops = KernelOps(device)
    try:
        self_check(ops, device)
    except RuntimeError:
        raise
    except Exception as err:  # noqa: BLE001 - compile errors, launch failures: all mean "fall back"
        raise RuntimeError(f"replay kernels failed to run on {device}: {err!r}") from err
    return ops


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def select_backend(device: torch.device, prefer: str = "auto") -> ReplayOps:
    """The replay ops the samplers call for ``device``.

    Args:
        device: the sampler's device.
        prefer: ``"auto"`` (kernels on CUDA when they pass their self-check, reference elsewhere),
            ``"reference"`` (always plain torch) or ``"kernels"`` (kernels or a warning + reference).

    Returns:
        :mod:`lightning_per.ops.reference`, or the compiled :class:`lightning_per.ops.kernels.KernelOps` of
        ``device`` (built and checked once per device, then shared).

    Raises:
        ValueError: ``prefer`` is not one of the three names.

    Example::

        >>> import torch
        >>> from lightning_per.ops import reference, select_backend
        >>> select_backend(torch.device("cpu"), "reference") is reference
        True
    """
    if prefer not in ("auto", "reference", "kernels"):
        raise ValueError(f"backend must be 'auto', 'reference' or 'kernels', got {prefer!r}")
    if prefer == "reference" or (device.type != "cuda" and prefer == "auto"):
        return reference
    key = str(device)
    if key not in _CHECKED:
        backend = None
        if load_ext() is None:
            _warn_once("ext-missing", "lightning_per: compiled replay kernels unavailable; "
                                      "using the plain-torch reference ops")
        else:
            try:
                backend = make_kernel_ops(device)  # builds and self-checks against reference
            except Exception as err:  # noqa: BLE001 - any build/self-check failure means fallback
                _warn_once("ext-failed", f"lightning_per: compiled replay kernels failed their "
                                         f"build or self-check on {device} ({err!r}); using the "
                                         f"plain-torch reference ops")
        _CHECKED[key] = backend
    return _CHECKED[key] or reference
