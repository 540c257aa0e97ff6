"""Backend selection for the replay ops: compiled kernels from ``ext/`` when they load and pass a
self-check against :mod:`lightning_per.ops.reference`, the reference ops otherwise.

A sampler calls :func:`select_backend` once, at construction (no device branches in hot
methods). A fallback is announced once with :func:`warnings.warn`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

from lightning_per.ops import reference

__all__ = ["select_backend", "load_ext"]

_WARNED: set[str] = set()
_CHECKED: dict[str, ModuleType | None] = {}


def load_ext() -> ModuleType | None:
    """Import the compiled-kernel package (``lightning_per.ext``, sources in the top-level ``ext/``).

    Returns None when it cannot be imported. Works for an installed package and for a source tree on
    ``PYTHONPATH`` (the ``ext/`` folder beside ``lightning_per/``).
    """
    try:
        return importlib.import_module("lightning_per.ext")
    except ImportError:
        pass
    src = Path(__file__).resolve().parents[2] / "ext" / "__init__.py"
    if not src.exists():
        return None
    spec = importlib.util.spec_from_file_location("lightning_per.ext", src,
                                                  submodule_search_locations=[str(src.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["lightning_per.ext"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:  # a broken build must not break the package: the caller falls back
        sys.modules.pop("lightning_per.ext", None)
        return None
    return module


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def select_backend(device: torch.device, prefer: str = "auto") -> ModuleType:
    """The module whose functions the samplers call for ``device``.

    Args:
        device: the sampler's device.
        prefer: ``"auto"`` (kernels on CUDA when they pass their self-check, reference elsewhere),
            ``"reference"`` (always plain torch) or ``"kernels"`` (kernels or a warning + reference).

    Returns:
        A module exposing the functions of :mod:`lightning_per.ops.reference` (``two_level_search``,
        ``reduce_blocks``, ...), possibly replaced by compiled versions.

    Raises:
        ValueError: ``prefer`` is not one of the three names.
    """
    if prefer not in ("auto", "reference", "kernels"):
        raise ValueError(f"backend must be 'auto', 'reference' or 'kernels', got {prefer!r}")
    if prefer == "reference" or (device.type != "cuda" and prefer == "auto"):
        return reference
    key = str(device)
    if key not in _CHECKED:
        ext = load_ext()
        backend = None
        if ext is None or not hasattr(ext, "make_backend"):
            _warn_once("ext-missing", "lightning_per: compiled replay kernels unavailable; "
                                      "using the plain-torch reference ops")
        else:
            try:
                backend = ext.make_backend(device)  # builds and self-checks against reference
            except Exception as err:  # noqa: BLE001 - any build/self-check failure means fallback
                _warn_once("ext-failed", f"lightning_per: compiled replay kernels failed their "
                                         f"build or self-check on {device} ({err!r}); using the "
                                         f"plain-torch reference ops")
        _CHECKED[key] = backend
    return _CHECKED[key] or reference
