"""from_torchrl: a TorchRL replay buffer's saved state (its ``dumps`` directory or its ``state_dict``) as one of ours.

What moves: the stored items (slots ``0 .. len - 1`` of a 1-D TensorDict storage), the writer's cursor and write
count, and for a ``PrioritizedSampler`` its alpha, beta, eps, every stored priority and the running max priority;
TorchRL's uniform ``RandomSampler`` becomes a :class:`GPUReplayBuffer`. TorchRL keeps transformed priorities
``v_i = (p_i + eps)^alpha`` in its sum tree; the raw ``p_i = v_i^(1 / alpha) - eps`` go to our sampler, which applies
the same transform, so draw probabilities ``P(i) = v_i / sum_k v_k`` and IS weights ``w_i = (N P(i))^-beta / max_j
(N P(j))^-beta`` are TorchRL's (Schaul et al. 2016, arXiv:1511.05952; TorchRL's normalisation by the buffer's max).

Nothing is unpickled or imported: a dumps directory is read as TorchRL writes it, JSON files and raw memmaps
(tensordict's ``meta.json`` layout, parsed here: dtypes from a fixed table), walked without following links
(:func:`lightning_per.integrity.walk_files`); any other file is refused, except ``prefetch.pkl`` (TorchRL's pickled
prefetch queue, empty unless prefetching) and ``rng_state/`` (the buffer generator), which are never opened. A
``state_dict`` is read from the dict the caller holds; its sum tree is indexed through TorchRL's own tree object.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data.replay_buffers.samplers import Sampler

from lightning_per.integrity import walk_files
from lightning_per.replay.buffer import (
    PRIORITIZED,
    GPUPrioritizedReplayBuffer,
    GPUReplayBuffer,
    check_prioritized_sampler,
)
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.random import GPURandomSampler
from lightning_per.replay.slice import GPUSliceSampler
from lightning_per.replay.storage import GPUTensorStorage, resolve_device

__all__ = ["TorchRLReplay", "from_torchrl", "read_torchrl_dumps", "read_torchrl_state_dict"]

#: The dtypes a tensordict ``meta.json`` may name, by the name it writes (``str(dtype)``).
_DTYPES = {str(d): d for d in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                               torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
                               torch.complex128)}

#: Files of a TorchRL dumps directory that are never opened (pickled or irrelevant to the replay's content).
_SKIPPED = ("prefetch.pkl",)
_SKIPPED_DIRS = ("rng_state/",)


@dataclass(frozen=True)
class TorchRLReplay:
    """What a TorchRL replay buffer held, read from its ``dumps`` directory or ``state_dict`` (host tensors).

    Attributes:
        data: the stored items, TensorDict ``[len]`` on the CPU (slot ``i`` at row ``i``; TorchRL's ``"index"``
            bookkeeping entry left out).
        capacity: the storage's ``max_size`` (slots).
        cursor: the writer's next slot; write_count: items ever written.
        priority: ``(len,) float64`` raw priorities of the stored items, None for a uniform sampler.
        alpha, beta, eps: the prioritized sampler's exponents and offset (None for a uniform sampler).
        max_priority: the sampler's running max raw priority (what new items get), None if never set.
        batch_size: the buffer's default batch (None if it had none).
    """

    data: TensorDict
    capacity: int
    cursor: int
    write_count: int
    priority: torch.Tensor | None
    alpha: float | None
    beta: float | None
    eps: float | None
    max_priority: float | None
    batch_size: int | None


def from_torchrl(source: str | os.PathLike[str] | dict[str, Any], *, sampler: Sampler | None = None,
                 device: torch.device | str | None = None,
                 **buffer_kwargs) -> GPUPrioritizedReplayBuffer | GPUReplayBuffer:
    """Our replay buffer holding what a TorchRL buffer saved: its ``dumps`` directory (a path) or its ``state_dict``.

    A ``PrioritizedSampler``'s buffer becomes a :class:`GPUPrioritizedReplayBuffer` with a
    :class:`GPUPrioritizedSampler` of the same alpha, beta and eps, the same raw priorities and running max
    (so the same draw probabilities and IS weights); a ``RandomSampler``'s becomes a :class:`GPUReplayBuffer` with
    a :class:`GPURandomSampler`. Storage: a :class:`GPUTensorStorage` of the same capacity on ``device``, the items
    in the same slots, the writer's cursor and write count as saved.

    Args:
        source: the directory TorchRL's ``rb.dumps(path)`` wrote, or the dict ``rb.state_dict()`` returned.
        sampler: the sampler instance to use instead (TorchRL saves no slice settings: its ``SliceSampler`` saves
            what ``RandomSampler`` saves, its ``PrioritizedSliceSampler`` what ``PrioritizedSampler`` saves): for a
            prioritized state one of our prioritized samplers of the saved capacity, alpha, beta and eps (e.g.
            :class:`GPUPrioritizedSliceSampler`), else a sampler without priorities (e.g. :class:`GPUSliceSampler`).
        device: where the buffer lives (default the ``sampler``'s, else CUDA when available, else CPU).
        **buffer_kwargs: passed to the buffer (e.g. ``generator``, ``priority_key``; ``batch_size`` defaults to
            the saved one).

    Returns:
        The buffer; ``len(rb)`` is the saved length.

    Raises:
        ValueError: ``source`` is not a TorchRL buffer state (the message names what is missing or wrong): another
            sampler (slice samplers, ...), a storage of ``ndim > 1`` or not of TensorDicts, a dumps directory with
            files other than JSON and memmaps (``transform.t``, pickles), a memmap of the wrong size.
        TypeError: ``source`` is neither a path nor a dict; ``sampler`` of the wrong kind for the saved state.
        lightning_per.integrity.IntegrityError: a link, FIFO or device inside the directory.

    Example::

        >>> import tempfile, torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
        >>> from lightning_per.replay import from_torchrl
        >>> theirs = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(8),
        ...                                            batch_size=4)
        >>> _ = theirs.extend(TensorDict({"obs": torch.arange(10.0)}, [10]))
        >>> theirs.update_priority(torch.arange(8), torch.arange(1.0, 9.0))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     theirs.dumps(d)
        ...     ours = from_torchrl(d, device="cpu")
        >>> len(ours), ours.writer.state_dict(), ours.sampler.alpha, float(ours.sampler.default_priority)
        (8, {'_cursor': 2, '_write_count': 10}, 0.7, 8.0)
    """
    if isinstance(source, (str, os.PathLike)):
        saved = read_torchrl_dumps(source)
    elif isinstance(source, dict):
        saved = read_torchrl_state_dict(source)
    else:
        raise TypeError(f"source must be a TorchRL dumps directory (a path) or a TorchRL buffer's state_dict (a "
                        f"dict), got {type(source).__name__}")
    if sampler is not None and saved.priority is not None:
        check_prioritized_sampler(sampler, alpha=saved.alpha, beta=saved.beta, eps=saved.eps, reduction=None,
                                  capacity=saved.capacity)
    if device is None and isinstance(sampler, (*PRIORITIZED, GPURandomSampler, GPUSliceSampler)):
        device = sampler.device
    device = resolve_device(device)
    storage = GPUTensorStorage(saved.capacity, device=device)
    buffer_kwargs.setdefault("batch_size", saved.batch_size)
    if saved.priority is None:
        rb = GPUReplayBuffer(storage=storage, sampler=sampler or GPURandomSampler(device=device), **buffer_kwargs)
    else:
        sampler = sampler or GPUPrioritizedSampler(saved.capacity, saved.alpha, saved.beta, saved.eps, device=device)
        rb = GPUPrioritizedReplayBuffer(storage=storage, sampler=sampler, **buffer_kwargs)
    n = saved.data.batch_size[0]
    if n:
        rb.extend(saved.data, update_priority=False)
    rb.writer.load_state_dict({"_cursor": saved.cursor, "_write_count": saved.write_count})
    if saved.priority is not None:
        if n:
            rb.update_priority(torch.arange(n, device=device), saved.priority.to(device, torch.float32))
        if saved.max_priority is not None:  # the running max, which may exceed every stored priority
            state = rb.sampler.state_dict()
            state["max_raw"] = torch.full_like(state["max_raw"], saved.max_priority)
            rb.sampler.load_state_dict(state)
    return rb


def read_torchrl_dumps(path: str | os.PathLike[str]) -> TorchRLReplay:
    """What a TorchRL buffer's ``dumps(path)`` wrote, read from JSON and raw memmaps only (nothing unpickled).

    Raises:
        ValueError, IntegrityError, FileNotFoundError: see :func:`from_torchrl`.
    """
    root = Path(path)
    files = walk_files(root)  # refuses links (tensordict would follow them) before anything is read
    known = {"buffer_metadata.json", "writer/metadata.json", "sampler/sampler_metadata.json",
             "sampler/sumtree.memmap", "sampler/mintree.memmap", "storage/storage_metadata.json"}
    for name in files:
        if name in known or name in _SKIPPED or name.startswith(_SKIPPED_DIRS):
            continue
        if name.startswith("storage/") and (name.endswith("/meta.json") or name.endswith(".memmap")):
            continue
        raise ValueError(f"{root}: {name!r} is not part of a TorchRL replay dump this reads (JSON and memmaps only; "
                         f"nothing is unpickled" + ("; transforms cannot be migrated: drop them before dumps"
                                                   if name == "transform.t" else "") + ")")
    for name in ("writer/metadata.json", "storage/storage_metadata.json", "storage/meta.json"):
        if name not in files:
            raise ValueError(f"{root}: no {name}: not a TorchRL replay buffer's dumps directory")
    writer = _json(files["writer/metadata.json"])
    meta = _json(files["storage/storage_metadata.json"])
    buffer = _json(files["buffer_metadata.json"]) if "buffer_metadata.json" in files else {}
    if meta.get("is_pytree"):
        raise ValueError(f"{root}: the storage holds pytrees, not TensorDicts (only TensorDict items migrate)")
    length = _count(meta.get("len"), "storage len")
    data, capacity = _read_tensordict(root / "storage", files, "storage/")
    sampler = (_json(files["sampler/sampler_metadata.json"]) if "sampler/sampler_metadata.json" in files
               else None)
    leaves = None
    if sampler is not None:
        if "sampler/sumtree.memmap" not in files:
            raise ValueError(f"{root}: sampler/sampler_metadata.json without sampler/sumtree.memmap")
        leaves = _memmap(files["sampler/sumtree.memmap"], torch.float64, (capacity,))
        sampler = {k: sampler.get(k) for k in ("_alpha", "_beta", "_eps", "_max_priority", "_max_capacity")}
        if sampler["_max_capacity"] != capacity:
            raise ValueError(f"{root}: the sampler's capacity {sampler['_max_capacity']!r} differs from the "
                             f"storage's {capacity}")
    elif any(name.startswith("sampler/") for name in files):
        raise ValueError(f"{root}: a sampler other than TorchRL's PrioritizedSampler or RandomSampler (files "
                         f"{sorted(n for n in files if n.startswith('sampler/'))}); only those two migrate")
    return _assemble(str(root), data, capacity, length, writer.get("cursor"), writer.get("write_count"), sampler,
                     leaves, buffer.get("batch_size"))


def read_torchrl_state_dict(state: dict[str, Any]) -> TorchRLReplay:
    """What a TorchRL buffer's ``state_dict()`` holds (the dict itself: nothing is loaded from disk).

    Raises:
        ValueError: see :func:`from_torchrl`.
    """
    missing = [k for k in ("_storage", "_sampler", "_writer") if k not in state]
    if missing:
        raise ValueError(f"not a TorchRL replay buffer state_dict: no {missing} (keys {sorted(map(str, state))})")
    storage, writer, sampler = state["_storage"], state["_writer"], state["_sampler"]
    if not (isinstance(storage, dict) and isinstance(storage.get("_storage"), dict)):
        raise ValueError("the state_dict's storage holds no TensorDict items (only TensorDict storages migrate)")
    fields = {}
    for key, value in storage["_storage"].items():
        if key.startswith("__"):  # tensordict's own metadata entries
            continue
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"the state_dict's storage entry {key!r} is a {type(value).__name__}, not a tensor")
        fields[tuple(key.split(".")) if "." in key else key] = value
    if not fields:
        raise ValueError("the state_dict's storage is empty (never written): nothing to migrate")
    capacity = next(iter(fields.values())).shape[0]
    data = TensorDict(fields, batch_size=[capacity])
    if not isinstance(writer, dict):
        raise ValueError(f"the state_dict's writer state must be a dict, got {type(writer).__name__}")
    leaves, meta = None, None
    if not isinstance(sampler, dict):
        raise ValueError(f"the state_dict's sampler state must be a dict, got {type(sampler).__name__}")
    if sampler:
        if "_sum_tree" not in sampler:
            raise ValueError(f"a sampler other than TorchRL's PrioritizedSampler or RandomSampler (state keys "
                             f"{sorted(sampler)}); only those two migrate")
        tree = sampler["_sum_tree"]
        leaves = torch.as_tensor(tree[torch.arange(capacity)], dtype=torch.float64)  # TorchRL's tree indexing
        meta = {"_alpha": sampler.get("_alpha"), "_beta": sampler.get("_beta"), "_eps": sampler.get("_eps"),
                "_max_priority": sampler.get("_max_priority")}
    return _assemble("state_dict", data, capacity, storage.get("_len"), writer.get("_cursor"),
                     writer.get("_write_count"), meta, leaves, state.get("_batch_size"))


def _assemble(where: str, data: TensorDict, capacity: int, length, cursor, write_count, sampler, leaves,
              batch_size) -> TorchRLReplay:
    """The checked :class:`TorchRLReplay` of the parts read (host values)."""
    length = _count(length, f"{where}: storage len")
    if length > capacity:
        raise ValueError(f"{where}: storage len {length} exceeds its capacity {capacity}")
    if data.batch_dims != 1:
        raise ValueError(f"{where}: storages of ndim > 1 do not migrate (batch {tuple(data.batch_size)})")
    cursor = _count(cursor, f"{where}: writer cursor")
    write_count = _count(write_count, f"{where}: writer write_count")
    if cursor >= capacity:
        raise ValueError(f"{where}: writer cursor {cursor} lies outside the storage's {capacity} slots")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        batch_size = None  # TorchRL's buffers may have none, or a non-int sampler-defined one
    items = data[:length].exclude("index")  # "index": the slot TorchRL's buffer stamped on each item
    if sampler is None:
        return TorchRLReplay(items, capacity, cursor, write_count, None, None, None, None, None, batch_size)
    alpha, beta, eps = (_number(sampler.get(k), f"{where}: sampler {k}") for k in ("_alpha", "_beta", "_eps"))
    values = leaves[:length]
    if not bool(torch.isfinite(values).all()) or bool((values < 0).any()):  # sync-ok: host tensors
        raise ValueError(f"{where}: the sampler's sum tree holds values that are not finite and >= 0")
    raw = torch.ones_like(values) if alpha == 0 else (values.pow(1.0 / alpha) - eps).clamp_min(0)
    top = sampler.get("_max_priority")
    top = top[0] if isinstance(top, (list, tuple)) and top else None
    max_priority = None if top is None else _number(float(top), f"{where}: sampler max priority")
    return TorchRLReplay(items, capacity, cursor, write_count, raw, alpha, beta, eps, max_priority, batch_size)


def _read_tensordict(directory: Path, files: dict[str, Path], prefix: str) -> tuple[TensorDict, int]:
    """The TensorDict a tensordict ``memmap`` wrote under ``prefix`` (its ``meta.json`` parsed here, leaves read
    as raw bytes of the named dtype and shape) and its batch size's first dim."""
    meta = _json(files[prefix + "meta.json"])
    shape = meta.get("shape")
    if not (isinstance(shape, list) and shape and all(isinstance(s, int) and s >= 0 for s in shape)):
        raise ValueError(f"{directory}: meta.json's shape must be a list of sizes, got {shape!r}")
    fields: dict[str, Any] = {}
    for key, entry in meta.items():
        if key in ("shape", "device", "_type") or not isinstance(entry, dict):
            continue
        if entry.get("type") == "TensorDict":
            if f"{prefix}{key}/meta.json" not in files:
                raise ValueError(f"{directory}: no {prefix}{key}/meta.json for the nested entry {key!r}")
            fields[key] = _read_tensordict(directory / key, files, f"{prefix}{key}/")[0]
            continue
        dtype = _DTYPES.get(entry.get("dtype"))
        if dtype is None or entry.get("is_nested") or not isinstance(entry.get("shape"), list):
            raise ValueError(f"{directory}: entry {key!r} is not a dense tensor of a known dtype ({entry!r}); only "
                             f"tensors migrate")
        name = f"{prefix}{key}.memmap"
        if name not in files:
            raise ValueError(f"{directory}: no {name} for the entry {key!r}")
        fields[key] = _memmap(files[name], dtype, tuple(entry["shape"]))
    return TensorDict(fields, batch_size=shape[:1]), shape[0]


def _memmap(path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The raw little-endian bytes of ``path`` as a ``shape`` ``dtype`` CPU tensor (a copy).

    Raises:
        ValueError: the file holds another number of bytes.
    """
    raw = np.fromfile(path, dtype=np.uint8)
    want = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if raw.size != want:
        raise ValueError(f"{path}: {raw.size} bytes, expected {want} for {tuple(shape)} {dtype}")
    return torch.from_numpy(raw).view(dtype).reshape(shape).clone()


def _json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as file:
        value = json.load(file)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _count(value, what: str) -> int:
    """``value`` as an int >= 0 (a JSON float of an integer accepted)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {value!r}")
    return value


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)
