"""SliceSpec: TorchRL's slice-sampler keywords, checked once, as a value the slice samplers hold.

Every keyword of TorchRL's :class:`~torchrl.data.SliceSampler` is accepted with its meaning (``docs/replay.md``,
"Slices"); ``cache_values``, ``compile`` and ``use_gpu`` only tune TorchRL's host-side trajectory scan, which these
samplers do not make (their trajectory state lives on the device and follows every write), so they are kept as
given and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_per.replay.errors import check_batch_size, check_bool, check_key

__all__ = ["SliceSpec", "parse_span"]

_AUTO_TRAJ_KEYS = (("collector", "traj_ids"), "episode")  # what TorchRL probes when no key is given


def parse_span(span) -> tuple[bool | int, bool | int]:
    """TorchRL's ``span`` as ``(left, right)``: a bool or an int ``>= 0`` for both sides, or a pair of them.

    Raises:
        TypeError: ``span`` is none of these.
        ValueError: a negative int.
    """
    pair = (span, span) if isinstance(span, (bool, int)) else span
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(s, (bool, int)) for s in pair)):
        raise TypeError(f"span must be a bool, an int or a (left, right) pair of them, got {span!r}")
    if any(not isinstance(s, bool) and s < 0 for s in pair):
        raise ValueError(f"span must hold bools or ints >= 0, got {span!r}")
    return pair[0], pair[1]


def _static(name: str, value) -> Tensor | None:
    if value is None:
        return None
    if not isinstance(value, Tensor) or value.ndim != 1 or not value.numel():
        raise TypeError(f"{name} must be a non-empty 1-D tensor (one entry per stored item), got "
                        f"{type(value).__name__} of shape {tuple(getattr(value, 'shape', ()))}")
    return value


@dataclass(frozen=True)
class SliceSpec:
    """TorchRL's slice keywords, checked (:meth:`build`); what the samplers and their
    :class:`~lightning_per.replay.slice_index.SliceIndex` read.

    Attributes:
        num_slices, slice_len: exactly one is an int >= 1.
        end_key, end_keys, traj_key: the trajectory marker (``end_key`` defaults to ``("next", "done")``); with
            ``auto_traj_key`` (no key given) TorchRL's probe of ``("collector", "traj_ids")`` then ``"episode"``
            comes first.
        ends, trajectories: a static ``(N,)`` end signal or trajectory ids given at construction (TorchRL's
            ``ends`` / ``trajectories``), used instead of stored keys.
        step_key, fragmented: TorchRL's fragmented mode (slices rebuilt from ``traj_key`` and ``step_key``).
        strict_length, pad_output: short slices dropped / kept; kept ones padded to ``T`` (static shape).
        span: ``(left, right)``, TorchRL's ``span``.
        truncated_key, init_key: where the batch marks slice ends / starts.
        cache_values, compile, use_gpu: TorchRL's tuning keywords, kept as given (no effect here).
    """

    num_slices: int | None
    slice_len: int | None
    end_key: Any
    end_keys: tuple | None
    traj_key: Any
    auto_traj_key: bool
    ends: Tensor | None
    trajectories: Tensor | None
    step_key: Any
    fragmented: bool
    strict_length: bool
    pad_output: bool
    span: tuple[bool | int, bool | int]
    truncated_key: Any
    init_key: Any
    cache_values: bool
    compile: bool | dict
    use_gpu: bool | torch.device | str

    @classmethod
    def build(cls, *, num_slices=None, slice_len=None, end_key=None, end_keys=None, traj_key=None,
              step_key="step_count", fragmented=False, ends=None, trajectories=None, cache_values=False,
              truncated_key=("next", "truncated"), init_key="is_init", strict_length=True, pad_output=False,
              compile=False, span=False, use_gpu=False) -> SliceSpec:
        """The checked keywords (TorchRL's defaults).

        Raises:
            ValueError: not exactly one of ``num_slices`` / ``slice_len`` (ints >= 1), ``end_key`` with
                ``end_keys``, a static signal with a key or with the other, ``pad_output`` with
                ``strict_length=True``, ``fragmented`` without ``step_key`` or with a static signal or a span.
            TypeError: a key that is not a str / tuple of str, a flag that is not a bool, a bad ``span``.
        """
        if (num_slices is None) == (slice_len is None):
            raise ValueError(f"give exactly one of num_slices and slice_len, got num_slices={num_slices!r} and "
                             f"slice_len={slice_len!r}")
        for name, value in (("num_slices", num_slices), ("slice_len", slice_len)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if end_key is not None and end_keys is not None:
            raise ValueError("end_key and end_keys are exclusive: give the single end flag as end_key, or the "
                             "flags to OR together as end_keys")
        if end_keys is not None and not isinstance(end_keys, (list, tuple)):
            raise TypeError(f"end_keys must be a list or tuple of keys of the stored TensorDict, got "
                            f"{type(end_keys).__name__} {end_keys!r}")
        if end_keys is not None and not len(end_keys):
            raise ValueError("end_keys must name at least one key")
        for name, key in (("end_key", end_key), ("traj_key", traj_key), ("truncated_key", truncated_key),
                          ("init_key", init_key), ("step_key", step_key),
                          *((f"end_keys[{i}]", k) for i, k in enumerate(end_keys or ()))):
            check_key(name, key, allow_none=not name.startswith("end_keys"))
        for name, value in (("strict_length", strict_length), ("pad_output", pad_output),
                            ("fragmented", fragmented), ("cache_values", cache_values)):
            check_bool(name, value)
        if pad_output and strict_length:
            raise ValueError("pad_output=True is incompatible with strict_length=True: padding only happens to the "
                             "short slices that strict_length=False keeps")
        ends, trajectories = _static("ends", ends), _static("trajectories", trajectories)
        keyed = traj_key is not None or end_key is not None or end_keys is not None
        if ends is not None and trajectories is not None:
            raise ValueError("ends and trajectories are exclusive: give one static trajectory signal")
        if (ends is not None or trajectories is not None) and keyed:
            raise ValueError("ends / trajectories replace the stored trajectory keys: give no end_key, end_keys or "
                             "traj_key with them")
        left, right = parse_span(span)
        for side, s in zip(("left", "right"), (left, right)):
            if slice_len is not None and not isinstance(s, bool) and s >= slice_len:
                raise ValueError(f"span's {side} int ({s}) must be below slice_len ({slice_len})")
        if fragmented and (step_key is None or ends is not None or trajectories is not None or left or right):
            raise ValueError("fragmented=True rebuilds slices from traj_key and step_key: it needs step_key and "
                             "takes no ends, trajectories or span")
        if not isinstance(compile, (bool, dict)):
            raise TypeError(f"compile must be a bool or a dict of torch.compile keywords, got {compile!r}")
        if not isinstance(use_gpu, (bool, str, torch.device)):
            raise TypeError(f"use_gpu must be a bool or a device, got {use_gpu!r}")
        return cls(num_slices=num_slices, slice_len=slice_len,
                   end_key=end_key if end_key is not None or end_keys is not None else ("next", "done"),
                   end_keys=tuple(end_keys) if end_keys is not None else None, traj_key=traj_key,
                   auto_traj_key=not keyed and ends is None and trajectories is None, ends=ends,
                   trajectories=trajectories, step_key=step_key, fragmented=fragmented, strict_length=strict_length,
                   pad_output=pad_output, span=(left, right), truncated_key=truncated_key, init_key=init_key,
                   cache_values=cache_values, compile=compile, use_gpu=use_gpu)

    @property
    def probe_keys(self) -> tuple:
        """The trajectory-id keys probed in order: ``traj_key``, or TorchRL's ``("collector", "traj_ids")`` then
        ``"episode"`` when no key was given."""
        if self.traj_key is not None:
            return (self.traj_key,)
        return _AUTO_TRAJ_KEYS if self.auto_traj_key else ()

    @property
    def ragged(self) -> bool:
        """Whether a slice can hold fewer than ``T`` steps (``strict_length=False`` or a span)."""
        return not self.strict_length or bool(self.span[0]) or bool(self.span[1])

    def shape(self, batch_size: int) -> tuple[int, int]:
        """``(T, num_slices)`` for a batch of ``batch_size`` transitions.

        Raises:
            ValueError: ``batch_size`` is not a multiple of ``slice_len`` / ``num_slices``, or a span int is not
                below ``T`` (named).
        """
        check_batch_size(batch_size)
        if self.num_slices is not None:
            if batch_size % self.num_slices:
                raise ValueError(f"batch_size ({batch_size}) must be a multiple of num_slices ({self.num_slices})")
            T, num = batch_size // self.num_slices, self.num_slices
        else:
            if batch_size % self.slice_len:
                raise ValueError(f"batch_size ({batch_size}) must be a multiple of slice_len ({self.slice_len})")
            T, num = self.slice_len, batch_size // self.slice_len
        for side, s in zip(("left", "right"), self.span):
            if not isinstance(s, bool) and s >= T:
                raise ValueError(f"span's {side} int ({s}) must be below the slice length {T}")
        return T, num

    def need(self, T: int) -> int:
        """The fewest steps a slice from a real start holds: ``T``, ``T - i`` for a right span ``i``, 1 for
        ``True``."""
        right = self.span[1]
        return T if right is False or right == 0 else 1 if right is True else max(T - right, 1)

    def left(self, T: int) -> int:
        """Virtual starts before a trajectory's first step (a left span): 0, ``i``, or ``T - 1`` for ``True``."""
        left = self.span[0]
        return 0 if left is False else T - 1 if left is True else left

    def set_torchrl_attributes(self, sampler) -> None:
        """The public attributes of TorchRL's ``SliceSampler`` that its inherited methods and TorchRL's code read
        (``__repr__``, ``__getstate__``, ``_used_traj_key``...), set on ``sampler`` from this spec."""
        sampler.num_slices, sampler.slice_len = self.num_slices, self.slice_len
        sampler.strict_length, sampler.pad_output = self.strict_length, self.pad_output
        sampler.end_key, sampler.end_keys, sampler.traj_key = self.end_key, self.end_keys, self.traj_key
        sampler.truncated_key, sampler.init_key, sampler.span = self.truncated_key, self.init_key, self.span
        sampler.step_key, sampler.fragmented, sampler.cache_values = self.step_key, self.fragmented, self.cache_values
        sampler.compile, sampler.use_gpu = bool(self.compile), bool(self.use_gpu)
