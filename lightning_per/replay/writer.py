"""GPURoundRobinWriter: TorchRL's round-robin writer that checks a batch before moving its cursor."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import expand_as_right
from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter

from lightning_per.replay.compat import advance_writer, direct_writer, mark_update_entities
from lightning_per.replay.storage import GPUTensorStorage

__all__ = ["GPURoundRobinWriter"]


class GPURoundRobinWriter(TensorDictRoundRobinWriter):
    """TorchRL's round-robin writer that validates a batch against the storage spec *before* moving
    its cursor, so a rejected ``extend`` leaves cursor, length, data and priorities unchanged.

    A batch that a :class:`GPUTensorStorage` can take as it is (flat keys, the stored spec, see
    :meth:`GPUTensorStorage.direct_pairs`) is written directly: the same cursor, write count, ``"index"``
    tag, stored values and ``mark_update`` calls as TorchRL's ``extend``, without its generic machinery.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from lightning_per.replay import GPURoundRobinWriter, GPUTensorStorage
        >>> rb = TensorDictReplayBuffer(storage=GPUTensorStorage(4, device="cpu"), writer=GPURoundRobinWriter())
        >>> rb.extend(TensorDict({"reward": torch.arange(6.0)}, [6]))  # the slots written: the ring wraps
        tensor([0, 1, 2, 3, 0, 1])
        >>> rb.extend(TensorDict({"reward": torch.zeros(2, 3)}, [2]))  # another shape: refused
        Traceback (most recent call last):
        ...
        ValueError: data['reward'] has per-item shape (3,), the storage holds ()
        >>> len(rb), rb.storage.get(torch.arange(4))["reward"]  # nothing changed
        (4, tensor([4., 5., 2., 3.]))
    """

    def extend(self, data):
        pairs = self._direct_pairs(data)
        if pairs is None:
            if isinstance(self._storage, GPUTensorStorage):  # ours; TorchRL's storages have no spec check
                self._storage.check_spec(data)
            return super().extend(data)
        index = self._write_direct(data, pairs)
        data.set("index", expand_as_right(index, data))  # as TorchRL's writer tags the batch
        mark_update_entities(self, index)
        return index

    def _direct_pairs(self, data):
        """:meth:`GPUTensorStorage.direct_pairs` of ``data`` when the direct write applies, else None."""
        storage = self._storage
        if (type(storage) is not GPUTensorStorage or not isinstance(data, TensorDictBase)
                or not direct_writer(self) or torch.compiler.is_compiling()):
            return None
        return storage.direct_pairs(data)

    def _write_direct(self, data, pairs) -> torch.Tensor:
        """Move the cursor by ``n = len(data)`` and write ``pairs`` at the slots; returns them, ``(n,)`` int64
        on ``data``'s device (CPU if it has none), as TorchRL's ``extend``: ``arange(cursor, cursor + n) %
        max_size``."""
        n, max_size = data.batch_size[0], self._storage.max_size
        cursor = advance_writer(self, n, max_size)
        index = torch.arange(cursor, cursor + n, dtype=torch.long, device=data.device or "cpu")
        wraps = cursor + n > max_size
        if wraps:
            index = index % max_size
        self._storage.write_direct(index, pairs, None if wraps else cursor)
        return index

    def add(self, data):
        if isinstance(self._storage, GPUTensorStorage) and isinstance(data, TensorDictBase):
            self._storage.check_spec(data.unsqueeze(0))
        return super().add(data)
