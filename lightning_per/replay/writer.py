"""GPURoundRobinWriter: TorchRL's round-robin writer that checks a batch before moving its cursor."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import expand_as_right
from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter

from lightning_per.replay.compat import (
    advance_writer,
    bump_generation,
    direct_writer,
    mark_update_entities,
    writer_cursor,
)
from lightning_per.replay.storage import GPUTensorStorage

__all__ = ["GPURoundRobinWriter"]


class GPURoundRobinWriter(TensorDictRoundRobinWriter):
    """TorchRL's round-robin writer that validates a batch against the storage spec *before* moving
    its cursor, and moves it only once the storage write has succeeded, so a rejected or failed ``extend``
    leaves cursor, write count, length, data, priorities and generations unchanged.

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
        if pairs is not None:
            index = self._write_direct(data, pairs)
            data.set("index", expand_as_right(index, data))  # as TorchRL's writer tags the batch
            mark_update_entities(self, index)
            return index
        storage = self._storage
        if not isinstance(storage, GPUTensorStorage):  # TorchRL's storages: TorchRL's extend
            return super().extend(data)
        storage.check_spec(data)
        if storage.layout == "torchrl":  # TorchRL's layout (ndim > 1 included): TorchRL's extend, checked above
            return super().extend(data)
        return self._write_checked(data)

    def _slots(self, data) -> tuple[int, int, torch.Tensor]:
        """``(n, cursor, slots)`` of a write of ``data`` at the cursor (which does not move here): ``slots`` ``(n,)``
        int64 on ``data``'s device (CPU if it has none), ``arange(cursor, cursor + n) % max_size`` as in TorchRL's
        ``extend``."""
        n, max_size = data.batch_size[0], self._storage.max_size
        cursor = writer_cursor(self)
        index = torch.arange(cursor, cursor + n, dtype=torch.long, device=data.device or "cpu")
        return n, cursor, (index % max_size if cursor + n > max_size else index)

    def _write_checked(self, data) -> torch.Tensor:
        """TorchRL's ``extend`` of a batch our ring storage checked (:meth:`GPUTensorStorage.check_spec`) but cannot
        write directly (the first write, nested or reordered keys, generation stamps, a subclass's storage): the
        ``"index"`` tag, the storage's ``set``, and only then the cursor and write count, the generations and the
        ``mark_update`` calls; so a write that raises leaves all of them as they were."""
        n, _, index = self._slots(data)
        data.set("index", expand_as_right(index, data))
        self._storage.set(index, data)
        advance_writer(self, n, self._storage.max_size)
        bump_generation(self, index, data)
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
        """Write ``pairs`` at the ``n = len(data)`` slots from the cursor, then move the cursor by ``n`` (a write that
        raises leaves cursor and write count as they were); returns the slots, ``(n,)`` int64 on ``data``'s device
        (CPU if it has none), as TorchRL's ``extend``: ``arange(cursor, cursor + n) % max_size``."""
        n, cursor, index = self._slots(data)
        self._storage.write_direct(index, pairs, None if cursor + n > self._storage.max_size else cursor)
        advance_writer(self, n, self._storage.max_size)
        return index

    def add(self, data):
        if isinstance(self._storage, GPUTensorStorage) and isinstance(data, TensorDictBase):
            self._storage.check_spec(data.unsqueeze(0))
        return super().add(data)
