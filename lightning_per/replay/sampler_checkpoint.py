"""The one checkpoint helper of every sampler: ``dumps`` / ``loads`` of a sampler's ``state_dict`` as
``path/sampler.pt`` (atomic rename; loaded with ``weights_only=True``), with an optional JSON summary beside it.
What a ``state_dict`` holds, and its schema version, is each sampler's (its core's,
:meth:`~lightning_per.replay.core.PriorityCore.state_dict`; the slice index's; the generator's,
:meth:`~lightning_per.replay._rng.SamplerRNG.state`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from lightning_per.utils import atomic_write, atomic_write_text

__all__ = ["dump", "load"]


def dump(path: str | os.PathLike, state: dict[str, Any], summary: dict[str, Any] | None = None) -> None:
    """Write ``state`` to ``path/sampler.pt`` (whole tensors, atomic rename) and ``summary``, when given, to
    ``path/sampler_metadata.json``; ``path`` is created if missing."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    atomic_write(path / "sampler.pt", lambda f: torch.save(state, f))
    if summary is not None:
        atomic_write_text(path / "sampler_metadata.json", json.dumps(summary))


def load(path: str | os.PathLike, device: torch.device) -> dict[str, Any]:
    """The ``state_dict`` that :func:`dump` wrote under ``path``, tensors on ``device`` (nothing unpickled)."""
    return torch.load(Path(path) / "sampler.pt", map_location=device, weights_only=True)
