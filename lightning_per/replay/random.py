"""GPURandomSampler: uniform replay drawn on the storage's device from the buffer's generator."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import RandomSampler

from lightning_per.replay._rng import DeviceRNGMixin
from lightning_per.replay.errors import EmptyBufferError, check_batch_size, check_kind, check_seed
from lightning_per.replay.storage import resolve_device

__all__ = ["GPURandomSampler"]

_SCHEMA_VERSION = 1


class GPURandomSampler(DeviceRNGMixin, RandomSampler):
    """Uniform sampling with replacement: ``P(i) = 1 / len(storage)``, drawn on ``device``.

    Args:
        device: where the indices are drawn (default CUDA when available, else CPU).
        seed: device-generator seed when no buffer generator is set.

    ``sample`` returns ``(index (B,) int64 on device, {})`` (no IS weights: they would all be 1).

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from lightning_per.replay import GPURoundRobinWriter, GPUTensorStorage
        >>> sampler = GPURandomSampler(device="cpu", seed=0)
        >>> rb = TensorDictReplayBuffer(storage=GPUTensorStorage(8, device="cpu"), sampler=sampler,
        ...                             writer=GPURoundRobinWriter(), batch_size=5)
        >>> _ = rb.extend(TensorDict({"reward": torch.arange(3.0)}, [3]))
        >>> index, info = sampler.sample(rb.storage, 5)
        >>> index.shape, bool(((index >= 0) & (index < 3)).all()), info  # only the 3 filled slots
        (torch.Size([5]), True, {})
    """

    def __init__(self, *, device: torch.device | str | None = None, seed: int | None = None) -> None:
        check_seed(seed)
        super().__init__()
        self._device = resolve_device(device)
        self._init_rng(seed)

    @property
    def device(self) -> torch.device:
        return self._device

    def sample(self, storage, batch_size: int) -> tuple[Tensor, dict]:
        """Raises ValueError for ``batch_size`` < 1 and EmptyBufferError for an empty storage."""
        check_batch_size(batch_size)
        n = len(storage)
        if n == 0:
            raise EmptyBufferError("Cannot sample from an empty replay buffer: extend it first")
        index = torch.randint(0, n, (batch_size,), generator=self.generator, device=self._device)
        return index, {}

    def state_dict(self) -> dict[str, Any]:
        return {"_schema_version": _SCHEMA_VERSION, "kind": type(self).__name__, "rng": self._rng_state()}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing (the replay buffer checks every part of
        a checkpoint this way before it loads any).

        Raises:
            ValueError: a checkpoint of another sampler kind or schema, or one without a usable generator state.
        """
        check_kind(state_dict, self)
        if "rng" not in state_dict:
            raise ValueError(f"not a uniform sampler checkpoint (keys {sorted(map(str, state_dict))})")
        version = state_dict.get("_schema_version", _SCHEMA_VERSION)
        if version != _SCHEMA_VERSION:
            raise ValueError(f"sampler checkpoint schema {version} is not {_SCHEMA_VERSION} (this code's uniform "
                             f"sampler); load it with the lightning_per version that wrote it")
        self._check_rng_checkpoint(state_dict["rng"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`.

        Raises:
            ValueError: as :meth:`check_state_dict`, before anything changes.
        """
        self.check_state_dict(state_dict)
        self._load_rng_state(state_dict["rng"])

    def dumps(self, path) -> None:
        from pathlib import Path
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(path) / "sampler.pt")

    def loads(self, path) -> None:
        from pathlib import Path
        self.load_state_dict(torch.load(Path(path) / "sampler.pt", map_location=self._device, weights_only=True))

    def _empty(self) -> None:
        return None
