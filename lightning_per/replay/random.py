"""GPURandomSampler (and its without-replacement variant): uniform replay drawn on the storage's device,
driven by the buffer's generator."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import RandomSampler, SamplerWithoutReplacement

from lightning_per.graphs.protocol import CapturableSampler, SamplerCapture
from lightning_per.replay import sampler_checkpoint
from lightning_per.replay._rng import SamplerRNG
from lightning_per.replay.compat import register_without_replacement
from lightning_per.replay.errors import EmptyBufferError, check_batch_size, check_kind, check_seed
from lightning_per.replay.storage import resolve_device
from lightning_per.schema import check, stamp

__all__ = ["GPURandomSampler", "GPUSamplerWithoutReplacement"]

_SCHEMA_VERSION = 1


class GPURandomSampler(RandomSampler):
    """Uniform sampling with replacement: ``P(i) = 1 / len(storage)``, drawn on ``device``.

    Args:
        device: where the indices are drawn (default CUDA when available, else CPU).
        seed: device-generator seed when no buffer generator is set.
        replacement: ``False`` builds a :class:`GPUSamplerWithoutReplacement` instead (TorchRL's
            ``RandomSampler(replacement=False)`` rule; its other keywords are forwarded).

    ``sample`` returns ``(index (B,) int64 on device, {})`` (no IS weights: they would all be 1); on a storage
    of ``ndim > 1`` the per-dimension tuple of ``torch.unravel_index`` over its filled shape.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from lightning_per import GPURandomSampler
        >>> from lightning_per.replay import GPURoundRobinWriter, GPUTensorStorage
        >>> sampler = GPURandomSampler(device="cpu", seed=0)
        >>> rb = TensorDictReplayBuffer(storage=GPUTensorStorage(8, device="cpu"), sampler=sampler,
        ...                             writer=GPURoundRobinWriter(), batch_size=5)
        >>> _ = rb.extend(TensorDict({"reward": torch.arange(3.0)}, [3]))
        >>> index, info = sampler.sample(rb.storage, 5)
        >>> index.shape, bool(((index >= 0) & (index < 3)).all()), info  # only the 3 filled slots
        (torch.Size([5]), True, {})
    """

    def __new__(cls, *args: Any, replacement: bool = True, **kwargs: Any):
        # torchrl >= 0.12 routes replacement=False through its samplers' metaclass before this runs; older
        # versions do not know the keyword, so the same rule is applied here
        if not replacement and cls is GPURandomSampler:
            return GPUSamplerWithoutReplacement(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, *, device: torch.device | str | None = None, seed: int | None = None,
                 replacement: bool = True) -> None:
        check_seed(seed)
        super().__init__()
        #: the sampler's generator, driven by the buffer's (:class:`~lightning_per.replay._rng.SamplerRNG`)
        self.rng = SamplerRNG(resolve_device(device), seed, type(self).__name__)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state: the attributes, the generators travelling as bytes
        (:class:`~lightning_per.replay._rng.SamplerRNG`)."""
        return self.__dict__.copy()

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
        return self.rng.device

    def manual_seed(self, seed: int) -> None:
        """Seed the generator. Raises TypeError / ValueError for a seed outside ``[-2**63, 2**64)``."""
        self.rng.manual_seed(seed)

    def get_rng_state(self) -> dict[str, Tensor | None]:
        """``{"generator": CPU uint8 tensor, "device_rng": None}``, to replay the draws with :meth:`set_rng_state`."""
        return self.rng.get_rng_state()

    def set_rng_state(self, state: dict[str, Tensor | None]) -> None:
        """Restore a :meth:`get_rng_state` result. Raises TypeError / ValueError for another dict; nothing changes."""
        self.rng.set_rng_state(state)

    def sample(self, storage, batch_size: int) -> tuple[Tensor, dict]:
        """Raises ValueError for ``batch_size`` < 1 and EmptyBufferError for an empty storage."""
        check_batch_size(batch_size)
        return self._draw(storage, batch_size)

    # Under torch.compile a draw would guard on len(storage), a host int every write changes, and recompile
    # at each new length; TorchRL runs its uniform draw outside compiled graphs for this reason
    # (Storage._rand_given_ndim), and so does this one.
    @torch.compiler.disable
    def _draw(self, storage, batch_size: int) -> tuple[Tensor, dict]:
        n = len(storage)
        if n == 0:
            raise EmptyBufferError("Cannot sample from an empty storage (the replay buffer holds no transition): "
                                   "extend it first")
        self.rng.follow()
        index = self.rng.randint(n, (batch_size,))
        if getattr(storage, "ndim", 1) > 1:
            return torch.unravel_index(index, storage.shape), {}
        return index, {}

    def capture_view(self, storage, batch_size: int | None) -> SamplerCapture:
        """What a CUDA-graph capture of the draws needs (:class:`lightning_per.graphs.protocol.CapturableSampler`):
        no device state, the sampler's generator and its RNG state; ``problem`` is None for ``storage`` None or a
        full ring, else why not: the draws read ``len(storage)``, a host int a graph freezes."""
        problem = None
        if storage is not None and len(storage) < storage.max_size:
            problem = (f"{type(self).__name__} draws from len(storage), a host int a CUDA graph freezes "
                       f"({len(storage)} of {storage.max_size}): capture once the buffer is full, or use the "
                       f"prioritized sampler")
        return SamplerCapture(problem, device=self.rng.device, generators=(self.rng.generator,),
                              get_rng_state=self.rng.get_rng_state, set_rng_state=self.rng.set_rng_state)

    def state_dict(self) -> dict[str, Any]:
        return stamp({"kind": type(self).__name__, "rng": self.rng.state()}, "sampler", _SCHEMA_VERSION)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing (the replay buffer checks every part of
        a checkpoint this way before it loads any).

        Raises:
            ValueError: a checkpoint of another sampler kind or schema, or one without a usable generator state.
        """
        check_kind(state_dict, self)
        if "rng" not in state_dict:
            raise ValueError(f"not a uniform sampler checkpoint (keys {sorted(map(str, state_dict))})")
        check(state_dict, "sampler", _SCHEMA_VERSION, missing=_SCHEMA_VERSION)  # unstamped: the first layout
        self.rng.check(state_dict["rng"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`.

        Raises:
            ValueError: as :meth:`check_state_dict`, before anything changes.
        """
        self.check_state_dict(state_dict)
        self.rng.load(state_dict["rng"])

    def dumps(self, path) -> None:
        sampler_checkpoint.dump(path, self.state_dict())

    def loads(self, path) -> None:
        self.load_state_dict(sampler_checkpoint.load(path, self.rng.device))

    def _empty(self) -> None:
        return None


class GPUSamplerWithoutReplacement(SamplerWithoutReplacement):
    """TorchRL's :class:`~torchrl.data.SamplerWithoutReplacement` (every stored item once per epoch, in a random
    order) with its permutation drawn on ``device`` from the sampler's own generator, driven by the buffer's
    generator as :class:`GPURandomSampler` is (no host round trip per batch).

    Args:
        drop_last, shuffle: as TorchRL's.
        device: where the permutation is drawn (default CUDA when available, else CPU).
        seed: device-generator seed when no buffer generator is set.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from lightning_per import GPUSamplerWithoutReplacement
        >>> from lightning_per.replay import GPURoundRobinWriter, GPUTensorStorage
        >>> rb = TensorDictReplayBuffer(storage=GPUTensorStorage(8, device="cpu"), writer=GPURoundRobinWriter(),
        ...                             sampler=GPUSamplerWithoutReplacement(device="cpu", seed=0), batch_size=3)
        >>> _ = rb.extend(TensorDict({"reward": torch.arange(6.0)}, [6]))
        >>> epoch = torch.cat([rb.sample()["index"] for _ in range(2)])  # two batches: one epoch
        >>> sorted(epoch.tolist())  # every stored item exactly once
        [0, 1, 2, 3, 4, 5]
    """

    def __init__(self, drop_last: bool = False, shuffle: bool = True, *, device: torch.device | str | None = None,
                 seed: int | None = None) -> None:
        super().__init__(drop_last=drop_last, shuffle=shuffle)
        #: the sampler's generator, driven by the buffer's (:class:`~lightning_per.replay._rng.SamplerRNG`)
        self.rng = SamplerRNG(resolve_device(device), seed, type(self).__name__)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state: the attributes, the generators travelling as bytes
        (:class:`~lightning_per.replay._rng.SamplerRNG`)."""
        return self.__dict__.copy()

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
        return self.rng.device

    def manual_seed(self, seed: int) -> None:
        """Seed the generator. Raises TypeError / ValueError for a seed outside ``[-2**63, 2**64)``."""
        self.rng.manual_seed(seed)

    def get_rng_state(self) -> dict[str, Tensor | None]:
        """``{"generator": CPU uint8 tensor, "device_rng": None}``, to replay the draws with :meth:`set_rng_state`."""
        return self.rng.get_rng_state()

    def set_rng_state(self, state: dict[str, Tensor | None]) -> None:
        """Restore a :meth:`get_rng_state` result. Raises TypeError / ValueError for another dict; nothing changes."""
        self.rng.set_rng_state(state)

    def _get_sample_list(self, storage, len_storage: int, batch_size: int) -> None:
        if storage is not None:
            self.rng.follow()
        device = self.rng.device
        if self.shuffle:
            self._sample_list = torch.randperm(len_storage, device=device, generator=self.rng.generator)
        else:
            self._sample_list = torch.arange(len_storage, device=device)
        if self.drop_last:
            self._remaining_batches = self._sample_list.numel() // batch_size
        else:
            self._remaining_batches = -(self._sample_list.numel() // -batch_size)

    def state_dict(self) -> dict[str, Any]:
        state = dict(super().state_dict())
        state["rng"] = self.rng.state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """TorchRL's state (epoch position) and, when present, the generator's.

        Raises:
            ValueError: the saved generator state does not fit this sampler's generator; nothing changes.
        """
        rng = state_dict.get("rng")
        if rng is not None:
            self.rng.check(rng)
        super().load_state_dict(state_dict)
        if rng is not None:
            self.rng.load(rng)


CapturableSampler.register(GPURandomSampler)  # isinstance answers; the MRO is unchanged
register_without_replacement(GPURandomSampler, GPUSamplerWithoutReplacement)  # GPURandomSampler(replacement=False)
