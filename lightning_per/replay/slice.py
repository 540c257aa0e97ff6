"""GPU slice samplers: trajectory slices drawn on the storage's device, drop-ins for TorchRL's
:class:`~torchrl.data.SliceSampler` (:class:`GPUSliceSampler`, here) and :class:`~torchrl.data.PrioritizedSliceSampler`
(:class:`~lightning_per.replay.slice_prioritized.GPUPrioritizedSliceSampler`).

A slice is up to ``T`` consecutive time steps of one trajectory. Which slots may start a slice is kept as device
state updated where the ring changes (``mark_update``, i.e. at every ``extend``), so a draw scans nothing:

* ``ends`` (an effective end flag per slot): the stored end signal (``end_key`` / ``end_keys``, or a change of
  ``traj_key`` between a step and the next), OR a slot of the row under the write head (the data after it was
  overwritten or never written: TorchRL's implicit truncation), OR an unfilled row. Kept as a two-level array like
  the priorities (:mod:`lightning_per.ops.reference`), so "the first end at or after step s" is a two-level search.
* ``valid`` (a start mask): slot ``s`` is filled and no end lies in its first ``need - 1`` steps (``need = T``, or
  fewer with a right ``span``), or, with ``strict_length=False``, ``s`` starts a trajectory (a shorter slice).
  An extend of ``m`` rows changes the ends of ``m + 1`` rows and the starts of ``m + need`` rows only, from one
  gather and one cumulative sum (static shapes, no host sync).

Storages of ``ndim=2`` (TorchRL's ``[time, envs]`` layout, which TorchRL's buffers write batches of ``[envs,
time]`` into) hold one trajectory stream per column: a slice follows its column, and the index is returned as
TorchRL's ``(time, env)`` tuple. A sampler used outside a buffer (TorchRL's ``storage.set`` then
``sampler.sample``) rebuilds its state from the storage when the storage's revision counter moved unseen.

Draws follow TorchRL's rules (``docs/replay.md``, "Slices", has the formulas and the differences table). The batch
is TorchRL's: ``strict_length=False`` (or a ``span``) returns the real steps of short slices only, a batch of
data-dependent length (read on the host); ``pad_output=True`` keeps ``num_slices * T`` slots (static shapes, for
CUDA graphs): a short slice repeats its last slot and ``("collector", "mask")`` is False on that padding.
``truncated_key`` is True at each slice's last real step (``done`` / ``terminated`` beside it, as TorchRL), and
``init_key`` (when stored) True at each slice's first step.

The ring must be written round-robin (consecutive rows, as TorchRL's and our writers do).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import SliceSampler

from lightning_per.replay import sampler_checkpoint
from lightning_per.replay._rng import SamplerRNG
from lightning_per.replay.errors import check_capacity, check_kind
from lightning_per.replay.slice_index import SLICE_SCHEMA_VERSION, SliceIndex
from lightning_per.replay.slice_output import expand, slice_batch
from lightning_per.replay.slice_spec import SliceSpec
from lightning_per.replay.slice_starts import UniformStarts
from lightning_per.replay.storage import resolve_device
from lightning_per.schema import stamp

__all__ = ["GPUSliceSampler"]


class GPUSliceSampler(SliceSampler):
    """Uniform slices of trajectories, drawn on ``device``: TorchRL's :class:`~torchrl.data.SliceSampler` rule.

    A trajectory uniformly among those with a valid start, then a start uniformly among its valid starts,
    so ``P(s) = 1 / (K n_k)``; the batch holds ``num_slices`` slices of up to ``T`` consecutive steps, slice after
    slice (``T = slice_len``, or ``batch_size // num_slices``). Subclasses TorchRL's class (``isinstance``
    holds); needs no host scan of the storage per draw (see :mod:`lightning_per.replay.slice`).

    Its state is :attr:`index` (a :class:`~lightning_per.replay.slice_index.SliceIndex` holding the starts rule
    :class:`~lightning_per.replay.slice_starts.UniformStarts`) and :attr:`rng`; its keywords :attr:`spec`.

    Args:
        capacity: the storage's ``max_size`` (slots N >= 1), or None (TorchRL's constructor): taken from the storage
            at first use.
        num_slices, slice_len, end_key, end_keys, traj_key, strict_length, truncated_key, init_key: TorchRL's
            (:class:`~lightning_per.replay.slice_spec.SliceSpec`; with no key given, TorchRL's probe of
            ``("collector", "traj_ids")``, then ``"episode"``, then ``end_key``).
        pad_output: with ``strict_length=False``, pad short slices to ``T`` (static shape, for CUDA graphs) instead
            of TorchRL's default shorter batch.
        span: TorchRL's ``span``: slices may start before a trajectory's first step (left) or run past its end
            (right), holding fewer steps (at least ``T - i`` for an int ``i``, one for ``True``).
        ends, trajectories: a static ``(N,)`` end signal / trajectory ids instead of stored keys (TorchRL's).
        fragmented, step_key: TorchRL's fragmented mode (slices rebuilt from ``traj_key`` and ``step_key`` when a
            trajectory's steps are not adjacent): served by TorchRL's own code (a host-side index), not on the device.
        cache_values, compile, use_gpu: TorchRL's tuning of its host scan; accepted, no effect (no scan here).
        device: where the state lives and the draws run (default CUDA when available, else CPU).
        seed: seed of the device generator when no buffer generator is set (default: a fresh one from
            ``torch.Generator().seed()``, so building a sampler leaves torch's global RNG untouched; pass ``seed``
            or give the buffer a generator for reproducible draws).

    Memory: ~19 bytes per slot: the stored end signal, the effective ends and the start mask (1 byte each), the
    effective ends' and the usable trajectory starts' leaves (float32 each), the trajectory ids (int64).

    Raises:
        ValueError, TypeError: a bad argument (named in the message, :meth:`SliceSpec.build`).

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from lightning_per import GPUSliceSampler
        >>> from lightning_per.replay import GPURoundRobinWriter, GPUTensorStorage
        >>> sampler = GPUSliceSampler(slice_len=3, traj_key="episode", device="cpu", seed=0)
        >>> rb = TensorDictReplayBuffer(storage=GPUTensorStorage(12, device="cpu"), sampler=sampler,
        ...                             writer=GPURoundRobinWriter(), batch_size=6)
        >>> _ = rb.extend(TensorDict({"episode": torch.arange(12) // 6, "obs": torch.arange(12.0)}, [12]))
        >>> batch = rb.sample()  # 2 slices of 3 consecutive steps, each inside one episode
        >>> episode, obs = batch["episode"].view(2, 3), batch["obs"].view(2, 3)
        >>> bool((episode == episode[:, :1]).all()), bool((obs.diff(dim=1) == 1).all())
        (True, True)
    """

    def __init__(self, capacity: int | None = None, *, num_slices: int | None = None, slice_len: int | None = None,
                 end_key=None, end_keys=None, traj_key=None, step_key="step_count", fragmented: bool = False,
                 ends: Tensor | None = None, trajectories: Tensor | None = None, cache_values: bool = False,
                 truncated_key=("next", "truncated"), init_key="is_init", strict_length: bool = True,
                 pad_output: bool = False, compile: bool | dict = False, span=False, use_gpu=False,
                 device: torch.device | str | None = None, seed: int | None = None, backend: str = "auto") -> None:
        if capacity is not None:
            check_capacity("capacity", capacity)
        #: the checked keywords (:class:`SliceSpec`)
        self.spec = SliceSpec.build(
            num_slices=num_slices, slice_len=slice_len, end_key=end_key, end_keys=end_keys, traj_key=traj_key,
            step_key=step_key, fragmented=fragmented, ends=ends, trajectories=trajectories, cache_values=cache_values,
            truncated_key=truncated_key, init_key=init_key, strict_length=strict_length, pad_output=pad_output,
            compile=compile, span=span, use_gpu=use_gpu)
        starts = UniformStarts(resolve_device(device), backend)
        #: the trajectory state, the start mask and its starts rule (:class:`SliceIndex`)
        self.index = SliceIndex(capacity, spec=self.spec, starts=starts, compiled=starts.compiled,
                                owner=type(self).__name__)
        self.spec.set_torchrl_attributes(self)
        # TorchRL's own state, read by its fragmented mode (served by TorchRL's code)
        self._fragmented_index, self._cache, self._gpu_device = None, {}, self.index.device
        self._fetch_traj, self._traj_key_auto = self.spec.traj_key is not None or self.spec.auto_traj_key, \
            self.spec.auto_traj_key
        #: the sampler's generator, driven by the buffer's (:class:`~lightning_per.replay._rng.SamplerRNG`)
        self.rng = SamplerRNG(starts.device, seed, type(self).__name__)

    @property
    def _rng(self) -> torch.Generator | None:
        """The buffer's generator (TorchRL assigns it); the draws follow it."""
        return self.rng.buffer

    @_rng.setter
    def _rng(self, generator: torch.Generator | None) -> None:
        self.rng.attach(generator)
        self.rng.follow()

    @property
    def generator(self) -> torch.Generator:
        """The sampler's own generator on :attr:`device`."""
        return self.rng.generator

    @property
    def device(self) -> torch.device:
        return self.index.device

    def manual_seed(self, seed: int) -> None:
        """Seed the generator. Raises TypeError / ValueError for a seed outside ``[-2**63, 2**64)``."""
        self.rng.manual_seed(seed)

    def get_rng_state(self) -> dict[str, Tensor | None]:
        """``{"generator": CPU uint8 tensor, "device_rng": None}``, to replay the draws with :meth:`set_rng_state`."""
        return self.rng.get_rng_state()

    def set_rng_state(self, state: dict[str, Tensor | None]) -> None:
        """Restore a :meth:`get_rng_state` result. Raises TypeError / ValueError for another dict; nothing changes."""
        self.rng.set_rng_state(state)

    def __repr__(self) -> str:
        i, s = self.index, self.spec
        return (f"{type(self).__name__}(capacity={i.slots if i.slots is not None else i.capacity}, "
                f"num_slices={s.num_slices}, slice_len={s.slice_len}, strict_length={s.strict_length}, "
                f"pad_output={s.pad_output}, span={s.span}, fragmented={s.fragmented}, device={i.device})")

    def add(self, index) -> None:  # the trajectory state follows mark_update (every write calls it)
        return None

    def extend(self, index) -> None:
        return None

    def mark_update(self, index, *, storage=None) -> None:
        """Items ``index`` were just written: update the trajectory state (see the module docstring).

        Raises:
            ValueError: the storage's ``max_size`` is not this sampler's capacity.
        """
        if self.spec.fragmented:
            return SliceSampler.mark_update(self, index, storage=storage)  # TorchRL's fragmented index
        self.index.written(index, storage)

    def check_signal(self, data) -> None:
        """Raise before a write of ``data`` that carries no trajectory marker (:meth:`SliceIndex.check_signal`)."""
        if not self.spec.fragmented:
            self.index.check_signal(data)

    def sample(self, storage, batch_size: int) -> tuple[Any, dict]:
        """Draw ``batch_size // T`` slices.

        Returns:
            ``(index, info)``: ``(batch_size,)`` int64 slots on :attr:`device`, slice after slice (fewer for a
            ragged batch, a ``(time, env)`` tuple on a 2-D storage); ``info`` the markers of the module docstring
            (``(B, 1)`` bool under ``truncated_key`` and its done / terminated keys; ``("collector", "mask")``
            ``(B,)`` with ``pad_output``).

        Raises:
            ValueError: ``batch_size`` not a multiple of the slice length / ``num_slices``; no valid slice.
            EmptyBufferError: the storage is empty.
        """
        if self.spec.fragmented:
            return SliceSampler.sample(self, storage, batch_size)  # TorchRL's fragmented mode
        T, num = self.index.prepare_draw(storage, batch_size)
        if self.traj_key is None and self.index.signal[0] == "traj":
            self.traj_key = self.index.signal[1]  # the probed key, where TorchRL's sampler sets it
        self.rng.follow()  # a buffer generator re-seeded in place replays the same slices
        start, cut = self.index.starts.draw(self.index, self.rng, num, T)
        return expand(self.index, start, cut, T, storage)

    def sample_gather(self, storage, batch_size: int, *, with_info: bool = False):
        """:meth:`sample`, and the batch with the info's entries set in it: ``(index, info, batch)``."""
        return slice_batch(storage, *self.sample(storage, batch_size), with_info)

    def probabilities(self, T: int | None = None) -> Tensor:
        """Exact ``P(s)`` of every slot as a start, ``(N,)`` float64 (:meth:`UniformStarts.probabilities`)."""
        return self.index.starts.probabilities(self.index)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        return stamp({"kind": type(self).__name__, "capacity": self.index.slots, "rng": self.rng.state(),
                      **self.index.state()}, "slice sampler", SLICE_SCHEMA_VERSION)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing.

        Raises:
            ValueError: another sampler kind or capacity, or missing / misshapen entries.
        """
        check_kind(state_dict, self)
        if state_dict == {}:
            return  # TorchRL's SliceSampler state: nothing (it rescans the storage)
        if state_dict.get("kind") != type(self).__name__:
            raise ValueError(f"not a {type(self).__name__} checkpoint (kind {state_dict.get('kind')!r}); a TorchRL "
                             f"SliceSampler's state is an empty dict")
        self.index.check_state(state_dict)
        self.rng.check(state_dict.get("rng"))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (raises as :meth:`check_state_dict`, before anything changes); TorchRL's
        empty state makes the sampler rebuild its trajectory state from the storage at its next draw."""
        self.check_state_dict(state_dict)
        if state_dict == {}:
            return self._empty()
        self.rng.load(state_dict["rng"])
        self.index.load_state(self.index.check_state(state_dict))

    def dumps(self, path) -> None:
        sampler_checkpoint.dump(path, self.state_dict())

    def loads(self, path) -> None:
        self.load_state_dict(sampler_checkpoint.load(path, self.index.device))

    def _empty(self) -> None:
        self.index.reset()
        if self._fragmented_index is not None:
            self._fragmented_index.clear()
