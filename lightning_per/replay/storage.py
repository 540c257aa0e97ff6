"""GPUTensorStorage: one preallocated ring of transitions on the device, and the writer that fills it.

A :class:`torchrl.data.LazyTensorStorage` whose writes are device-to-device copies with no host
synchronisation: ``len()`` is a host int advanced by the host-side write cursor (as in the ring
buffer of the seed design), reads index the whole preallocated tensors (static shapes, so sample
and read can be captured in a CUDA graph), and a write whose keys, shapes or dtypes differ from the
stored ones is rejected *before* anything changes.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage
from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter

__all__ = ["GPUTensorStorage", "GPURoundRobinWriter", "default_device"]

STORAGE_SCHEMA_VERSION = 2  # 2: packed storages save their ring of rows (packed_rows)


def default_device() -> torch.device:
    """``cuda`` (the current device) when available, else ``cpu``."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _spec(td: TensorDictBase, skip_batch: int = 1) -> dict[Any, tuple[tuple[int, ...], torch.dtype]]:
    return {k: (tuple(v.shape[skip_batch:]), v.dtype)
            for k, v in td.items(include_nested=True, leaves_only=True)}


def _row_layout(spec: dict[Any, tuple[tuple[int, ...], torch.dtype]]):
    """Byte offsets of each field in a packed row: ``({key: (offset, nbytes, dtype, shape)}, row_bytes)``.

    Fields go in order of decreasing element size (then insertion order), each at an offset aligned to
    its element size; the row is padded to a multiple of 8 bytes. ``(None, 0)`` if some element size
    exceeds 8 bytes."""
    sizes = {k: torch.empty((), dtype=dtype).element_size() for k, (_, dtype) in spec.items()}
    if any(es > 8 for es in sizes.values()):
        return None, 0
    layout, offset = {}, 0
    for key in sorted(spec, key=lambda k: -sizes[k]):  # stable: insertion order within a size
        shape, dtype = spec[key]
        es = sizes[key]
        offset = -(-offset // es) * es
        nbytes = es * math.prod(shape)
        layout[key] = (offset, nbytes, dtype, shape)
        offset += nbytes
    return layout, max(8, -(-offset // 8) * 8)


def _field_views(rows: torch.Tensor, layout) -> dict[Any, torch.Tensor]:
    """Views ``(n, *shape) dtype`` of each field of ``rows`` ``(n, row_bytes / 8) int64`` (no copy)."""
    raw = rows.view(torch.uint8)  # (n, row_bytes)
    n = rows.shape[0]
    return {key: raw[:, off:off + nbytes].view(dtype).view(n, *shape)
            for key, (off, nbytes, dtype, shape) in layout.items()}


class GPUTensorStorage(LazyTensorStorage):
    """Ring storage of transitions preallocated on ``device`` at the first write.

    Args:
        max_size: capacity in transitions (>= 1).
        device: where the data lives; default ``cuda`` when available, else ``cpu``.
        fallback: on CUDA out-of-memory at allocation, keep the data on the CPU instead (one
            :class:`RuntimeWarning`); with ``False`` the OOM error propagates.
        packed: keep all keys in one ring of rows (one gather per read; batch fields are views, see
            Layout). Default False: batches are plain contiguous tensors, as TorchRL's.

    Layout: a :class:`~tensordict.TensorDict` of batch ``[max_size]``, one tensor per key
    (e.g. ``observation: (max_size, 4) float32``), on :attr:`device`. With ``packed=True`` every key
    is a view into one row-major ``(max_size, row_bytes / 8) int64`` ring (:attr:`rows`):
    each transition is one row of ``row_bytes`` bytes (its fields at offsets aligned to their element
    size, the row padded to 8 bytes), so a read of ``B`` transitions is a single gather kernel, whatever
    the number of keys, and the batch's tensors are views into that gathered ``(B, row_bytes / 8)``
    block: their batch stride is the row, not the field. Consequences: ``torch.save`` of a batch (or
    of two of its fields) fails (views of one buffer under different dtypes) and ``.view(-1)`` of a
    multi-dimensional field fails, until ``.contiguous()``/``.clone()``; one field kept alive keeps the
    whole gathered block alive. Made for learners that consume a batch at once (the DQN module uses it).
    Keys whose element size exceeds 8 bytes (e.g. complex128) keep one tensor each (``packed`` then
    has no effect).

    Raises:
        ValueError: ``max_size < 1``.
        TypeError/ValueError (from :meth:`check_spec`): a write with other keys, shapes or dtypes.
    """

    def __init__(self, max_size: int, *, device: torch.device | str | None = None, fallback: bool = True,
                 ndim: int = 1, packed: bool = False) -> None:
        if not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size must be an int >= 1, got {max_size!r}")
        if ndim != 1:
            raise ValueError(f"GPUTensorStorage is a flat ring: ndim must be 1, got {ndim}")
        device = default_device() if device is None else torch.device(device)
        super().__init__(max_size, device=device, ndim=1)
        self.fallback = fallback
        self.packed = bool(packed)
        self._spec: dict | None = None
        self.rows: torch.Tensor | None = None  # (max_size, row_bytes / 8) int64 when packed
        self._layout: dict[Any, tuple[int, int, torch.dtype, tuple[int, ...]]] = {}  # key: (offset, nbytes, ..)

    # ------------------------------------------------------------------ allocation
    def _init_standard(self, data: TensorDictBase | torch.Tensor) -> None:
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"GPUTensorStorage stores TensorDicts, got {type(data).__name__}")
        try:
            self._allocate(data, torch.device(self.device))
        except torch.OutOfMemoryError:
            if not self.fallback:
                raise
            warnings.warn(f"GPUTensorStorage: out of memory allocating {self.max_size} transitions on "
                          f"{self.device}; keeping the replay data on the CPU instead", RuntimeWarning,
                          stacklevel=4)
            torch.cuda.empty_cache()
            self.device = torch.device("cpu")
            self._allocate(data, self.device)

    def _allocate(self, item: TensorDictBase, device: torch.device) -> None:
        leaves = {k: v for k, v in item.items(include_nested=True, leaves_only=True) if k != "index"}
        layout, row_bytes = _row_layout({k: (tuple(v.shape), v.dtype) for k, v in leaves.items()})
        if self.packed and layout is not None:
            self.rows = torch.zeros((self.max_size, row_bytes // 8), dtype=torch.int64, device=device)
            self._layout = layout
            tensors = _field_views(self.rows, layout)
        else:
            self.rows, self._layout = None, {}
            tensors = {k: torch.zeros((self.max_size, *v.shape), dtype=v.dtype, device=device)
                       for k, v in leaves.items()}
        self._storage = TensorDict(tensors, batch_size=[self.max_size], device=device)
        self._spec = _spec(self._storage)
        self._index_flat()
        self.initialized = True

    def _repack(self) -> None:
        """Put the packed views back after TorchRL's ``load_state_dict`` (it may install new tensors)."""
        views = _field_views(self.rows, self._layout)
        for key, view in views.items():
            current = self._storage.get(key)
            if current is not view:
                if current.data_ptr() != view.data_ptr() or current.stride() != view.stride():
                    view.copy_(current)
                self._storage.set(key, view)

    def _index_flat(self) -> None:
        """Cache the leaf tensors for the fast read path (flat, non-nested keys only)."""
        keys = list(self._storage.keys(include_nested=True, leaves_only=True))
        self._flat = ({k: self._storage.get(k) for k in keys}
                      if all(isinstance(k, str) for k in keys) else None)

    @property
    def nbytes(self) -> int:
        """Bytes held by the preallocated transitions (0 before the first write)."""
        if not self.initialized:
            return 0
        if self.rows is not None:
            return self.rows.numel() * self.rows.element_size()
        return sum(v.numel() * v.element_size() for v in self._storage.values(True, True))

    # ------------------------------------------------------------------ writes
    def check_spec(self, data: TensorDictBase) -> None:
        """Raise if a batch ``data`` (batch dim first) cannot be written; changes nothing.

        Raises:
            TypeError: ``data`` is not a TensorDict, or a key has another dtype.
            ValueError: other keys, or another per-item shape, than the stored ones.
        """
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"data must be a TensorDict with a leading batch dimension, got "
                            f"{type(data).__name__}")
        if self._spec is None:
            return
        got = _spec(data.exclude("index") if "index" in data.keys() else data)
        want = self._spec
        if set(got) != set(want):
            missing, extra = sorted(map(str, set(want) - set(got))), sorted(map(str, set(got) - set(want)))
            raise ValueError(f"data keys differ from the stored spec: missing {missing}, unexpected {extra}")
        for key, (shape, dtype) in want.items():
            if got[key][0] != shape:
                raise ValueError(f"data[{key!r}] has per-item shape {got[key][0]}, the storage holds {shape}")
            if got[key][1] != dtype:
                raise TypeError(f"data[{key!r}] has dtype {got[key][1]}, the storage holds {dtype}")

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Write ``data`` (batch ``[n]``) at slots ``cursor`` (``(n,)`` int64 tensor, range or int).

        A device-to-device copy (``data`` is moved with ``non_blocking=True`` if it is elsewhere).
        With ``set_cursor`` the host length grows by ``n`` up to ``max_size`` (ring writes).
        """
        if isinstance(data, TensorDictBase) and data.batch_dims == 0:
            data = data.unsqueeze(0)
            cursor = torch.as_tensor([cursor]) if isinstance(cursor, int) else cursor
        self.check_spec(data)
        if not self.initialized:
            self._init(data[0])
        device = torch.device(self.device)
        if isinstance(cursor, torch.Tensor):
            cursor = cursor.to(device, non_blocking=True)
        data = data.to(device, non_blocking=True)
        if "index" in data.keys():  # the writer tags batches with their slots; the sampler returns it
            data = data.exclude("index")
        if set_cursor:
            self._last_cursor = cursor
            self._len = min(self._len + data.shape[0], self.max_size)
        self._storage[cursor] = data
        self._bump_mutation_revision()

    # ------------------------------------------------------------------ reads
    def get(self, index):
        """Transitions at ``index`` (``(B,)`` int64 on :attr:`device`): a TensorDict ``[B]`` on the device.

        Reads the whole preallocated ring (no slicing by the host length), so the shapes are static;
        indices come from a sampler and lie in ``[0, len(self))``.

        Raises:
            RuntimeError: nothing was ever written.
        """
        if not self.initialized:
            raise RuntimeError("Cannot read from an empty GPUTensorStorage: extend it first")
        if isinstance(index, torch.Tensor) and index.device != self._storage.device:
            index = index.to(self._storage.device, non_blocking=True)
        flat = getattr(self, "_flat", None)
        if flat is None or not isinstance(index, torch.Tensor) or index.ndim != 1:
            return self._storage[index]
        if self.rows is not None:  # one gather of whole rows; the fields are views into it
            return TensorDict._new_unsafe(_field_views(self.rows[index], self._layout),
                                          batch_size=index.shape, device=self._storage.device)
        # one gather per key (advanced indexing: on the H200 3.2 us for a (256, 51) float32 batch against
        # index_select's 4.0, benchmarks/results/gather_h200.json), and a TensorDict built without
        # re-validating shapes we guarantee
        return TensorDict._new_unsafe({k: v[index] for k, v in flat.items()},
                                      batch_size=index.shape, device=self._storage.device)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """TorchRL's storage state (``_storage``: one tensor per key, ``initialized``, ``_len``); a packed
        storage saves its ring of rows once instead (``packed_rows`` + ``packed_layout``, schema 2):
        ``torch.save`` cannot store views of one buffer under different dtypes, and a per-key copy would
        double the device memory while saving."""
        if self.rows is None:
            state = super().state_dict()
            state["_schema_version"] = STORAGE_SCHEMA_VERSION
            return state
        layout = [(key, off, nbytes, str(dtype).removeprefix("torch."), list(shape))
                  for key, (off, nbytes, dtype, shape) in self._layout.items()]
        return {"_schema_version": STORAGE_SCHEMA_VERSION, "_storage": {}, "packed_rows": self.rows,
                "packed_layout": layout, "initialized": self.initialized, "_len": self._len}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict` (packed or per-key, into a packed or per-key storage).

        Raises:
            ValueError: the state was written by a newer schema.
        """
        version = state_dict.get("_schema_version", 0)
        if version > STORAGE_SCHEMA_VERSION:
            raise ValueError(f"storage checkpoint schema {version} is newer than this code "
                             f"({STORAGE_SCHEMA_VERSION}); upgrade lightning_per")
        if "packed_rows" in state_dict:
            self._load_packed(state_dict)
            return
        stored = state_dict["_storage"]
        if isinstance(stored, dict) and stored and not self.initialized:
            # TensorDict.state_dict flattens nested keys with "."; rebuild the nesting first
            flat = {k: v for k, v in stored.items() if k != "__batch_size" and k != "__device"}
            item = TensorDict(flat, batch_size=[self.max_size]).unflatten_keys(".")[0]
            self._allocate(item, torch.device(self.device))
        super().load_state_dict(state_dict)
        if self.initialized:
            if self.rows is not None:
                self._repack()
            self._spec = _spec(self._storage)
            self._index_flat()

    def _load_packed(self, state_dict: dict[str, Any]) -> None:
        rows = state_dict["packed_rows"]
        layout = {(tuple(k) if isinstance(k, list) else k): (off, nbytes, getattr(torch, dtype), tuple(shape))
                  for k, off, nbytes, dtype, shape in state_dict["packed_layout"]}
        if rows.shape[0] != self.max_size:
            raise ValueError(f"the saved storage holds {rows.shape[0]} slots, this one max_size={self.max_size}")
        fields = _field_views(rows, layout)
        if not self.initialized:
            self._allocate(TensorDict({k: v[0] for k, v in fields.items()}, batch_size=[]),
                           torch.device(self.device))
        if self.rows is not None and self._layout == layout:
            self.rows.copy_(rows)
        else:
            for key, value in fields.items():
                self._storage.get(key).copy_(value)
        self.initialized = bool(state_dict["initialized"])
        self._len = int(state_dict["_len"])
        self._bump_mutation_revision()

    def dumps(self, path: str | os.PathLike) -> None:
        """Save the whole ring to ``path/storage.pt`` in one ``torch.save`` (atomic: temp + rename)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / "storage.pt.tmp"
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path / "storage.pt")

    def loads(self, path: str | os.PathLike) -> None:
        """Load what :meth:`dumps` wrote (onto this storage's device)."""
        state = torch.load(Path(path) / "storage.pt", map_location=torch.device(self.device), weights_only=False)
        self.load_state_dict(state)


class GPURoundRobinWriter(TensorDictRoundRobinWriter):
    """TorchRL's round-robin writer that validates a batch against the storage spec *before* moving
    its cursor, so a rejected ``extend`` leaves cursor, length, data and priorities unchanged."""

    def extend(self, data):
        check = getattr(self._storage, "check_spec", None)
        if check is not None:
            check(data)
        return super().extend(data)

    def add(self, data):
        check = getattr(self._storage, "check_spec", None)
        if check is not None and isinstance(data, TensorDictBase):
            check(data.unsqueeze(0))
        return super().add(data)
