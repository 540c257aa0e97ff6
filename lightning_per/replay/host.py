"""PinnedHostStorage: transitions in page-locked host memory, read and written by the GPU directly.

For buffers larger than the GPU: the ring of transitions (one packed row each, as
:class:`GPUTensorStorage` ``packed=True``) lives in pinned host memory, while priorities, sampling and IS
weights stay with the sampler on the GPU. Under unified virtual addressing a page-locked allocation has one
address for host and device, so a batch read is one kernel that gathers the sampled rows over the bus
(:func:`lightning_per.ext.gather.gather_rows`) and a write one kernel that scatters the new rows into host
memory: no staging copy, no host synchronisation, and both capturable in a CUDA graph. Without CUDA the
same logic runs on plain host memory with the plain-torch gather and scatter (the test oracle).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from lightning_per.ops import select_backend
from lightning_per.replay.ring import RingState, make_batch
from lightning_per.replay.rows import batch_views, field_views, last_writes, pack_plan, row_layout, view_plan
from lightning_per.replay.slots import cursor_slots
from lightning_per.replay.storage import GPUTensorStorage, resolve_device

__all__ = ["PinnedHostStorage"]


#: ``cudaHostRegisterPortable | cudaHostRegisterMapped``: pinned for every device, in their address space.
_REGISTER_FLAGS = 0x01 | 0x02


class _PageLock:
    """Page-locks the memory of a host tensor with ``cudaHostRegister`` and unlocks it when collected.

    ``tensor.pin_memory()`` would go through torch's caching host allocator, which rounds an allocation up to
    a power of two (an 85 GB ring would ask for 128 GiB); registering the tensor's own pages costs nothing
    beyond its size."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.ptr = tensor.data_ptr()
        err = torch.cuda.cudart().cudaHostRegister(self.ptr, tensor.numel() * tensor.element_size(),
                                                   _REGISTER_FLAGS)
        if int(err) != 0:
            self.ptr = None
            raise RuntimeError(f"cudaHostRegister of {tensor.numel() * tensor.element_size()} bytes failed "
                               f"(cudaError {int(err)}): page-locked memory is limited by the host's RAM "
                               f"and its memlock limit")

    def __del__(self) -> None:
        if self.ptr is not None:
            torch.cuda.cudart().cudaHostUnregister(self.ptr)


class PinnedHostStorage(GPUTensorStorage):
    """Ring of transitions in page-locked host memory whose batches the GPU gathers directly.

    Args:
        max_size: capacity in transitions (>= 1).
        device: where batches (and the sampler) live; default ``cuda`` when available, else ``cpu``.
        pin: page-lock the host ring (``cudaHostRegister``; default: when CUDA is available).

    Layout (:attr:`layout` ``"host"``): ``ring.rows`` ``(max_size, row_bytes / 8) int64`` on the host (pinned),
    each transition one row (the layout of :class:`GPUTensorStorage` ``packed=True``); ``get(index)`` returns a
    TensorDict ``[B]`` on :attr:`device` whose fields are cut from the gathered ``(B, row_bytes / 8)`` block.
    A batch's bytes cross the bus each read: PCIe bandwidth, not device memory, bounds its cost (see the
    ``storage`` benchmark suite). Reading the host ring on the host (``state_dict``) first waits for the
    device's pending writes (one synchronisation, at checkpoints only).

    Raises:
        ValueError: ``max_size < 1``; ``device`` names CUDA without CUDA.
        TypeError/ValueError (from :meth:`check_spec`): a write with other keys, shapes or dtypes.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from lightning_per import PinnedHostStorage
        >>> s = PinnedHostStorage(100, device="cpu")
        >>> s.set(torch.arange(3), TensorDict({"observation": torch.ones(3, 51)}, [3]))
        >>> s.get(torch.tensor([2, 0]))["observation"].shape
        torch.Size([2, 51])
    """

    def __init__(self, max_size: int, *, device: torch.device | str | None = None, pin: bool | None = None) -> None:
        device = resolve_device(device)
        super().__init__(max_size, device=device, fallback=False, packed=True)
        self.layout = "host"
        self.pin = torch.cuda.is_available() if pin is None else bool(pin)
        self._batch_device = device
        self._lock: _PageLock | None = None
        #: the ops backend of the batch device (:func:`lightning_per.ops.select_backend`): its ``gather_rows`` /
        #: ``scatter_rows`` read and write the host ring (zero-copy kernels on CUDA, host indexing elsewhere)
        self.ops = select_backend(device)

    def __setstate__(self, state) -> None:
        """Unpickling (:meth:`GPUTensorStorage.__setstate__`), the ops backend chosen again."""
        super().__setstate__(state)
        self.ops = select_backend(self._batch_device)

    # ------------------------------------------------------------------ allocation
    def _allocate(self, item: TensorDictBase, device: torch.device) -> None:
        """Preallocate the packed host ring for items like ``item`` (batch ``[]``); batches are read onto
        :attr:`device` (``ring.device``).

        Raises:
            TypeError: a field's element size exceeds 8 bytes (it cannot be packed).
        """
        leaves = {k: v for k, v in item.items(include_nested=True, leaves_only=True) if k != "index"}
        layout, row_bytes = row_layout({k: (tuple(v.shape), v.dtype) for k, v in leaves.items()})
        if layout is None:
            raise TypeError("PinnedHostStorage packs each transition into one row: element sizes above 8 bytes "
                            "(e.g. complex128) are not supported")
        self._lock = None  # the previous ring's lock goes first
        ring = self.ring = RingState(device=self._batch_device)
        ring.rows = torch.zeros((self.max_size, row_bytes // 8), dtype=torch.int64)
        if self.pin:
            self._lock = _PageLock(ring.rows)
        ring.layout, ring.plan, ring.pack = layout, view_plan(layout, row_bytes // 8), pack_plan(layout)
        self._storage = TensorDict(field_views(ring.rows, layout), batch_size=[self.max_size], device="cpu")
        self._index_flat()
        self.initialized = True

    # ------------------------------------------------------------------ writes
    def _block(self, data: TensorDictBase) -> torch.Tensor:
        """``data``'s transitions as packed rows ``(n, row_bytes / 8) int64`` on :attr:`device`."""
        n = data.batch_size[0]
        block = torch.zeros((n, self.ring.rows.shape[1]), dtype=torch.int64, device=self._batch_device)
        for key, view in field_views(block, self.ring.layout).items():
            view.copy_(data.get(key), non_blocking=True)
        return block

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Write ``data`` (batch ``[n]``) at slots ``cursor`` (``(n,)`` int64 tensor, range or int): packed on
        :attr:`device`, then one kernel scatters the rows into the host ring (no host synchronisation).

        Raises:
            As :meth:`check_spec`, before anything changes.
        """
        if isinstance(data, TensorDictBase) and data.batch_dims == 0:
            data = data.unsqueeze(0)
            cursor = torch.as_tensor([cursor]) if isinstance(cursor, int) else cursor
        self.check_spec(data)
        if not self.initialized:
            self._init(data[0])
        slots = cursor_slots(cursor, self.max_size, self._batch_device)
        if "index" in data.keys():
            data = data.exclude("index")
        block = self._block(data.to(self._batch_device, non_blocking=True))
        if slots.shape[0] > self.max_size:  # a repeated slot gets its last write
            block = block[last_writes(slots, self.max_size)]
        self.ops.scatter_rows(self.ring.rows, slots, block)
        if set_cursor:
            self._last_cursor = cursor
            self._len = min(self._len + data.shape[0], self.max_size)
        self._bump_revision()

    # ------------------------------------------------------------------ reads
    def read(self, index, extra: dict[str, torch.Tensor] | None = None):
        """The read path: the transitions at slots ``index`` (a ``(B,)`` int64 tensor, or a 0-d one for one
        transition): one gather of their rows from the host ring (zero-copy on CUDA) into a ``(B, row_bytes /
        8)`` block on :attr:`device`, fields copied out of it, plus ``extra`` (moved to :attr:`device`).

        Raises:
            RuntimeError: nothing was ever written.
        """
        if not self.initialized:
            raise RuntimeError("Cannot read from an empty PinnedHostStorage: extend it first")
        ring, device = self.ring, self._batch_device
        if not isinstance(index, torch.Tensor):
            index = torch.as_tensor(index, dtype=torch.int64)
        squeeze = index.dim() == 0
        index = index.reshape(-1).to(device=device, dtype=torch.int64, non_blocking=True)
        block = self.ops.gather_rows(ring.rows, index)  # [B, W] on the device
        fields = batch_views(block, ring.layout, ring.plan)
        if extra:
            for key, value in extra.items():
                fields[key] = value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        batch = make_batch(ring, fields, index.shape)
        return batch[0] if squeeze else batch

    # ------------------------------------------------------------------ persistence
    def _settle(self) -> None:
        if self._batch_device.type == "cuda":
            torch.cuda.current_stream(self._batch_device).synchronize()  # sync-ok: host reads of the ring

    def state_dict(self) -> dict[str, Any]:
        """As :meth:`GPUTensorStorage.state_dict` (packed rows), after the device's pending writes."""
        self._settle()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As :meth:`GPUTensorStorage.load_state_dict` (after the device's pending writes and reads)."""
        self._settle()
        super().load_state_dict(state_dict)
