"""Persistence of the prioritized samplers: ``state_dict`` (schema :data:`SAMPLER_SCHEMA_VERSION`), the checks a
checkpoint passes before anything loads, the load, and ``dumps`` / ``loads`` (atomic rename)."""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_per.replay import priority as core
from lightning_per.replay._rng import _fingerprint
from lightning_per.replay.errors import check_exponent, check_kind
from lightning_per.schema import check, stamp
from lightning_per.utils import atomic_write, atomic_write_text

__all__ = ["PrioritizedCheckpoint", "SAMPLER_SCHEMA_VERSION"]

SAMPLER_SCHEMA_VERSION = 1


class PrioritizedCheckpoint:
    """``state_dict`` / ``check_state_dict`` / ``load_state_dict`` / ``dumps`` / ``loads`` of
    :class:`~lightning_per.replay.GPUPrioritizedSampler` (mixed into it; reads and restores its
    :class:`~lightning_per.replay.priority.PriorityState` and host hyper-parameters)."""

    def state_dict(self) -> dict[str, Any]:
        return stamp({
            "kind": type(self).__name__,
            "max_capacity": self._max_capacity,
            "alpha": self._alpha, "beta": float(self._beta), "eps": self._eps,  # sync-ok: a device beta, saving
            "raw": self._raw.clone(), "max_raw": self._max_raw.clone(),
            "n_clamped": self._n_clamped.clone(), "n_dropped": self._n_dropped.clone(),
            "written": (self._leaves.view(-1) > 0).clone(),
            "rng": self._rng_state(),
            "device_rng": None if self._device_rng is None else self._device_rng.clone(),
        }, "sampler", SAMPLER_SCHEMA_VERSION)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing (the replay buffer checks every part of
        a checkpoint this way before it loads any): another sampler kind, schema or ``max_capacity``, and
        missing or misshapen entries, which the load would otherwise meet half-way through. Host work only.

        Raises:
            ValueError: the checkpoint is refused (the message names why).
        """
        check_kind(state_dict, self)
        if "_sum_tree" in state_dict or "_min_tree" in state_dict:  # TorchRL's own PrioritizedSampler state
            raise ValueError("this is the state of TorchRL's PrioritizedSampler (its C++ sum and min trees), which "
                             "this sampler cannot load: load the storage alone and set new priorities with "
                             "update_priority")
        if "max_capacity" not in state_dict:
            raise ValueError(f"not a prioritized sampler checkpoint (keys {sorted(map(str, state_dict))})")
        check(state_dict, "sampler", SAMPLER_SCHEMA_VERSION, missing=0)  # 0: TorchRL's own sampler state
        if state_dict["max_capacity"] != self._max_capacity:
            raise ValueError(f"checkpoint max_capacity {state_dict['max_capacity']} differs from "
                             f"this sampler's {self._max_capacity}")
        numbers, scalars = ("eps", "alpha", "beta"), ("max_raw", "n_clamped", "n_dropped")
        missing = sorted(k for k in (*numbers, *scalars, "raw", "written", "rng") if k not in state_dict)
        if missing:
            raise ValueError(f"prioritized sampler checkpoint lacks {missing}")
        for key in numbers:
            if isinstance(state_dict[key], bool) or not isinstance(state_dict[key], (int, float)):
                raise ValueError(f"sampler checkpoint's {key!r} must be a number, got {type(state_dict[key]).__name__}")
        if not (math.isfinite(state_dict["eps"]) and state_dict["eps"] > 0):
            raise ValueError(f"sampler checkpoint's 'eps' must be a finite number > 0, got {state_dict['eps']!r}")
        try:
            check_exponent("alpha", state_dict["alpha"], eps=float(state_dict["eps"]))
            check_exponent("beta", state_dict["beta"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"sampler checkpoint's {err}") from None
        shapes = {"raw": self._raw.shape, "written": self._raw.shape, **{key: torch.Size([]) for key in scalars}}
        for key, shape in shapes.items():
            value = state_dict[key]
            if not isinstance(value, Tensor) or value.shape != shape:
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"sampler checkpoint's {key!r} must be a tensor of shape {tuple(shape)}, got {got}")
        raw = state_dict["raw"]
        if not bool(((raw >= 0) & torch.isfinite(raw)).all()):  # sync-ok: checkpoint load, not a step
            raise ValueError("sampler checkpoint's raw priorities must be finite and >= 0 (every write sanitizes "
                             "them): the checkpoint is corrupted")
        # the running max: -inf before any write, else at least every written slot's raw priority (so >= 0)
        max_raw, written = state_dict["max_raw"], state_dict["written"].bool()
        top = raw[written].max() if bool(written.any()) else torch.tensor(0.0)  # sync-ok: checkpoint load
        if not bool((max_raw == float("-inf")) | (torch.isfinite(max_raw) & (max_raw >= top))):  # sync-ok: load
            raise ValueError(f"sampler checkpoint's 'max_raw' must be -inf (nothing written) or finite and >= every "
                             f"written raw priority, got {float(max_raw)} against {float(top)}: the checkpoint "
                             "is corrupted")
        for key in ("n_clamped", "n_dropped"):
            if state_dict[key].dtype != torch.int64 or bool(state_dict[key] < 0):  # sync-ok: checkpoint load
                raise ValueError(f"sampler checkpoint's {key!r} must be an int64 count >= 0, got {state_dict[key]!r}")
        self._check_rng_checkpoint(state_dict["rng"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (in place).

        Raises:
            ValueError: as :meth:`check_state_dict`, before anything changes.
        """
        self.check_state_dict(state_dict)
        d = self._device
        self._eps = float(state_dict["eps"])
        self._alpha, self._beta = float(state_dict["alpha"]), float(state_dict["beta"])
        self._state.eps, self._state.raw_limit = self._eps, core.raw_limit(self._alpha, self._eps)
        self._alpha_t.fill_(self._alpha)
        self._beta_t.fill_(self._beta)
        self._raw.copy_(state_dict["raw"].to(d))
        self._max_raw.copy_(state_dict["max_raw"].to(d))
        self._n_clamped.copy_(state_dict["n_clamped"].to(d))
        self._n_dropped.copy_(state_dict["n_dropped"].to(d))
        self._leaves.view(-1).copy_(state_dict["written"].to(d).to(torch.float32))  # mask, then values
        self._rebuild()
        self._load_rng_state(state_dict["rng"])
        if self._device_rng is not None:  # the draws' stream as saved
            saved = state_dict.get("device_rng")
            if saved is not None and saved.shape == self._device_rng.shape:
                self._device_rng.copy_(saved.to(d))
            else:  # a checkpoint without it (older, or from the reference ops): a stream of its own, not a restart
                warnings.warn("sampler checkpoint has no 'device_rng' (the compiled draws' random state): seeding "
                              "it from the restored generator's state; the draws differ from the original run's",
                              RuntimeWarning, stacklevel=2)
                self._seeded(_fingerprint(self.generator))

    def dumps(self, path: str | os.PathLike) -> None:
        """Write the state to ``path/sampler.pt`` (whole tensors, atomic rename) + a JSON summary."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        atomic_write(path / "sampler.pt", lambda f: torch.save(state, f))
        meta = stamp({"kind": type(self).__name__, "alpha": self._alpha, "beta": float(self._beta),
                      "eps": self._eps, "max_capacity": self._max_capacity}, "sampler", SAMPLER_SCHEMA_VERSION)
        atomic_write_text(path / "sampler_metadata.json", json.dumps(meta))

    def loads(self, path: str | os.PathLike) -> None:
        self.load_state_dict(torch.load(Path(path) / "sampler.pt", map_location=self._device, weights_only=True))
