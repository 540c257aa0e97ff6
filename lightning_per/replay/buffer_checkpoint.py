"""Checkpoint checks of the replay buffers: a buffer ``state_dict`` or ``dumps`` directory is checked part by part
(storage, sampler, writer, and that they come from one save) before anything loads, and dumps are written whole
and verified (:mod:`lightning_per.integrity`). Host work on the (CPU) checkpoint only."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torchrl.data import RoundRobinWriter

from lightning_per.integrity import (
    MANIFEST_NAME,
    IntegrityError,
    atomic_directory,
    refuse_pickled_files,
    verify_directory,
)
from lightning_per.replay.compat import buffer_parts
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.random import GPURandomSampler
from lightning_per.replay.rank import GPURankBasedSampler
from lightning_per.replay.slice import GPUSliceSampler
from lightning_per.replay.slice_prioritized import GPUPrioritizedSliceSampler
from lightning_per.replay.storage import GPUTensorStorage
from lightning_per.schema import SCHEMA_KEY, check

__all__ = ["BUFFER_SCHEMA_VERSION", "checked_state", "verified_dumps", "verified_loads"]

BUFFER_SCHEMA_VERSION = 1
#: The name the buffer's version had before :data:`~lightning_per.schema.SCHEMA_KEY` (read as an alias).
_LEGACY_KEYS = ("_lightning_per_schema",)

#: What TorchRL's ``ReplayBuffer.load_state_dict`` reads with ``state_dict[key]``.
_BUFFER_KEYS = ("_storage", "_sampler", "_writer", "_transforms", "_batch_size")


#: Our parts that check a state before loading it (``check_state_dict``); any other part (TorchRL's, a user's, our
#: ``GPUSamplerWithoutReplacement`` on TorchRL's state) is left to its own load.
_SELF_CHECKED = (GPUTensorStorage, GPUPrioritizedSampler, GPURankBasedSampler, GPURandomSampler, GPUSliceSampler,
                 GPUPrioritizedSliceSampler)


def _check_part(part, state) -> None:
    """Raise what ``part.load_state_dict(state)`` would refuse, changing nothing: the ``check_state_dict`` of our
    storage and samplers (:data:`_SELF_CHECKED`); parts that are not ours are left to their own load."""
    if isinstance(part, _SELF_CHECKED):
        part.check_state_dict(state)


def _check_writer_state(writer, state, capacity: int | None = None) -> None:
    """Raise what TorchRL's round-robin writer's ``load_state_dict`` would fail on (its cursor, which must also
    lie inside the storage's ``capacity`` slots), changing nothing."""
    if isinstance(writer, RoundRobinWriter):
        if not (isinstance(state, dict) and "_cursor" in state):
            raise ValueError("the checkpoint's writer state has no '_cursor' (not a round-robin writer's state_dict)")
        cursor = state["_cursor"]
        if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
            raise ValueError(f"the checkpoint's writer cursor must be an int >= 0, got {cursor!r}")
        if capacity is not None and cursor >= capacity:
            raise ValueError(f"the checkpoint's writer cursor {cursor} lies outside the storage's {capacity} slots")
        count = state.get("_write_count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ValueError(f"the checkpoint's writer write_count must be an int >= 0, got {count!r}")


def _check_parts_agree(rb, storage_state, sampler_state, writer_state) -> None:
    """Raise unless the storage's, the sampler's and the writer's saved states describe one buffer: the length
    the writer's count implies (``min(write_count, capacity)``, cursor ``write_count % capacity``) is the
    storage's, and a (plain) prioritized sampler knows exactly the filled slots. Parts from different saves disagree.
    Host reads of the (CPU) checkpoint only."""
    storage = buffer_parts(rb).storage
    capacity = getattr(storage, "max_size", None)
    length = storage_state.get("_len") if isinstance(storage_state, dict) else None
    length = int(length) if isinstance(length, int) or (isinstance(length, torch.Tensor) and length.numel() == 1) \
        else None
    count = writer_state.get("_write_count") if isinstance(writer_state, dict) else None
    if isinstance(capacity, int) and isinstance(count, int) and not isinstance(count, bool):
        if length is not None and length != min(count, capacity):
            raise ValueError(f"the checkpoint's parts disagree: the storage holds {length} transitions, the writer "
                             f"wrote {count} into {capacity} slots (parts of different saves)")
        cursor = writer_state.get("_cursor")
        if isinstance(cursor, int) and cursor != count % capacity:
            raise ValueError(f"the checkpoint's parts disagree: writer cursor {cursor} after {count} writes into "
                             f"{capacity} slots")
    elif isinstance(capacity, int) and length is not None and length < capacity and isinstance(writer_state, dict):
        # no write count saved (torchrl < 0.12): a ring that has not wrapped yet has its cursor at its length
        cursor = writer_state.get("_cursor")
        if isinstance(cursor, int) and not isinstance(cursor, bool) and cursor != length:
            raise ValueError(f"the checkpoint's parts disagree: the storage holds {length} of {capacity} slots, "
                             f"the writer's cursor is {cursor} (parts of different saves)")
    written = sampler_state.get("written") if isinstance(sampler_state, dict) else None
    # the plain samplers give every written slot a priority (slice samplers only valid starts; frame-stack storages
    # mask slots): there the filled slots and the prioritized ones are the same set
    plain = (type(storage) is GPUTensorStorage and isinstance(sampler_state, dict)
             and sampler_state.get("kind") in ("GPUPrioritizedSampler", "GPURankBasedSampler"))
    if plain and length is not None and isinstance(written, torch.Tensor) and written.device.type == "cpu":
        known = int(written[:capacity].sum()) if isinstance(capacity, int) else int(written.sum())  # host tensor
        if known != length:
            raise ValueError(f"the checkpoint's parts disagree: the storage holds {length} transitions, the "
                             f"sampler's priorities cover {known} slots (parts of different saves)")


def _check_batch_size_state(batch_size) -> None:
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"the checkpoint's batch_size must be None or an int >= 1, got {batch_size!r}")


def checked_state(rb, state_dict) -> dict[str, Any]:
    """``state_dict`` without our schema tag, once every refusal that the buffer's load would meet part-way
    (a newer buffer schema, missing parts, the sampler's and the writer's refusals) has been ruled out.

    Raises:
        TypeError: ``state_dict`` is not a dict (or its sampler part is not).
        ValueError: the checkpoint is refused; nothing has changed.
    """
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a replay buffer's state_dict() (a dict), got {type(state_dict).__name__}")
    state_dict = check(state_dict, "replay", BUFFER_SCHEMA_VERSION, legacy_keys=_LEGACY_KEYS,
                       missing=BUFFER_SCHEMA_VERSION)  # TorchRL's own state: the first layout
    missing = [key for key in _BUFFER_KEYS if key not in state_dict]
    if missing:
        raise ValueError(f"not a replay buffer checkpoint: it lacks {missing} (keys {sorted(map(str, state_dict))})")
    storage, sampler, writer = buffer_parts(rb)
    _check_part(storage, state_dict["_storage"])
    _check_part(sampler, state_dict["_sampler"])
    _check_writer_state(writer, state_dict["_writer"], getattr(storage, "max_size", None))
    _check_parts_agree(rb, state_dict["_storage"], state_dict["_sampler"], state_dict["_writer"])
    _check_batch_size_state(state_dict["_batch_size"])
    return {k: v for k, v in state_dict.items() if k not in (SCHEMA_KEY, *_LEGACY_KEYS)}


def _check_dumps_dir(rb, path: str | os.PathLike) -> None:
    """Raise what ``rb.loads(path)`` would refuse part-way, changing nothing: reads the storage's and the
    sampler's saved states the way our ``dumps`` wrote them (``path/storage/storage.pt``,
    ``path/sampler/sampler.pt``) and checks them as :func:`_check_part`; checks that the writer's and the
    buffer's metadata files (TorchRL's ``dumps``) are there and hold a valid cursor and batch size.

    Raises:
        FileNotFoundError: a part of the checkpoint is missing.
        TypeError, ValueError: as :func:`_check_part`, or a metadata file lacks its entries.
    """
    path = Path(path).absolute()  # as TorchRL's loads
    storage, sampler, writer = buffer_parts(rb)
    states = {}
    for part, file in ((storage, path / "storage" / "storage.pt"), (sampler, path / "sampler" / "sampler.pt")):
        if not isinstance(part, _SELF_CHECKED):
            continue
        if part is storage and not file.is_file() and (file.parent / "storage_metadata.json").is_file():
            continue  # items in TorchRL's layout, saved by TorchRL's checkpointer: its own loads checks them
        if not file.is_file():
            raise FileNotFoundError(f"no {file.parent.name} checkpoint at {file} (a directory written by a replay "
                                    f"buffer's dumps() has one)")
        # memory-mapped onto the CPU: the checks read metadata and shapes (the sampler's also its priorities),
        # no device memory and no second copy of the ring
        states[file.parent.name] = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        _check_part(part, states[file.parent.name])
    if isinstance(writer, RoundRobinWriter):
        meta = _check_json(path / "writer" / "metadata.json", "cursor")
        states["writer"] = {"_cursor": meta["cursor"], "_write_count": meta.get("write_count")}
        _check_writer_state(writer, states["writer"], getattr(storage, "max_size", None))
    _check_parts_agree(rb, states.get("storage"), states.get("sampler"), states.get("writer"))
    _check_batch_size_state(_check_json(path / "buffer_metadata.json", "batch_size")["batch_size"])


def _check_json(file: Path, key: str) -> dict[str, Any]:
    if not file.is_file():
        raise FileNotFoundError(f"no {file.name} at {file.parent} (a directory written by a replay buffer's dumps() "
                                f"has one)")
    try:
        content = json.loads(file.read_text())
    except ValueError as err:
        raise ValueError(f"{file} is not valid JSON: {err}") from err
    if not isinstance(content, dict) or key not in content:
        raise ValueError(f"{file} has no {key!r} entry")
    return content


def verified_dumps(rb, path, write: Callable[[Any], None]) -> None:
    """Save ``rb`` to the directory ``path`` whole: ``write(staging)`` (TorchRL's ``dumps`` of the buffer) fills a new
    directory, a manifest of every file's SHA-256 is written last, then the directory is swapped into place
    (:func:`lightning_per.integrity.atomic_directory`). A crash at any instant leaves the old dump or the new one.

    Raises:
        ValueError: ``path`` exists and is not a dump directory (nothing is written or removed).
    """
    with atomic_directory(path, kind=_DUMP_KIND, meta={"buffer": type(rb).__name__,
                                                       "schema": BUFFER_SCHEMA_VERSION}) as staging:
        write(staging)


def verified_loads(rb, path, read: Callable[[Any], None]) -> None:
    """Load a :func:`verified_dumps` directory into ``rb`` with ``read(path)`` (TorchRL's ``loads`` of the buffer),
    after verifying its manifest and checking every part: a damaged, truncated, partial or mixed dump is refused
    naming the file, and a refused directory changes nothing. TorchRL pickles the prefetch queue to
    ``prefetch.pkl`` and unpickles it on load (which may run code): our buffers write none and never read one (it
    is not in the manifest, so a directory holding one is refused).

    Raises:
        FileNotFoundError: no directory at ``path``.
        IntegrityError (a ValueError): a missing, truncated, damaged or unlisted file, or no manifest (for a
            directory TorchRL's ``dumps`` wrote, the message names ``lightning_per.from_torchrl``).
        TypeError, ValueError: a part this buffer refuses (see its ``load_state_dict``).
    """
    root = Path(path)
    if (not (root / MANIFEST_NAME).exists() and (root / "storage" / "storage_metadata.json").is_file()
            and not (root / "storage" / "storage.pt").exists() and not (root / "sampler" / "sampler.pt").exists()):
        # TorchRL's layout (its storage metadata, no part of ours), not one of our dumps cut short
        raise IntegrityError(f"{root}: no {MANIFEST_NAME}: this is a directory TorchRL's rb.dumps() wrote, which "
                             f"loads does not read; lightning_per.from_torchrl(path) builds a buffer of it (data, "
                             f"write cursor, priorities)")
    verify_directory(path, kind=_DUMP_KIND)
    refuse_pickled_files(path)
    _check_dumps_dir(rb, path)
    read(path)


_DUMP_KIND = "replay_dump"
