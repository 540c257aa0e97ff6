"""Every access of :mod:`lightning_per.replay` to private attributes of TorchRL, tensordict and torch, in one place.

Each function names the third-party attribute it reads or writes; ``tests/replay/test_replay_compat.py`` checks that
each attribute still exists in the installed versions, so an upgrade that removes one fails there, by name,
instead of deep in a write path. The adapters' own inherited state (``LazyTensorStorage._storage``, ``_len``,
``_last_cursor``, the writer's ``_storage``, a buffer subclass's ``self._sampler``) is theirs and stays with them;
a TorchRL private read on any other object (a buffer handed to a function, a writer, a storage) is a function
here (``tests/project/test_layering.py`` checks that no other module reads one).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from tensordict import TensorDict

__all__ = ["BufferParts", "advance_writer", "attached_entities", "buffer_generator", "buffer_locks", "buffer_parts",
           "bump_generation", "bump_mutation_revision", "direct_writer", "is_compilable", "last_written_row",
           "layout_options", "mark_update_entities", "mutation_revision", "plain_extend",
           "register_without_replacement", "stored_data", "tracks_generations", "tree_leaves", "unlocked_len",
           "unsafe_tensordict", "wrapped_gym_env", "writer_cursor"]


def unsafe_tensordict(fields: dict, batch_size, device) -> TensorDict:
    """A TensorDict of ``fields`` built without re-validating their shapes (tensordict's private
    ``TensorDict._new_unsafe``): for batches whose shapes the caller guarantees (hot read paths)."""
    return TensorDict._new_unsafe(fields, batch_size=batch_size, device=device)


def register_without_replacement(cls: type, without: type) -> bool:
    """Make ``cls(replacement=False)`` build ``without``, as TorchRL's ``RandomSampler(replacement=False)`` builds
    its ``SamplerWithoutReplacement`` (the private table ``samplers.base._REPLACEMENT_DISPATCH``, torchrl >= 0.12;
    older versions have no ``replacement`` keyword at all). Returns whether the table exists."""
    try:
        from torchrl.data.replay_buffers.samplers.base import _REPLACEMENT_DISPATCH
    except ImportError:
        return False
    _REPLACEMENT_DISPATCH[cls] = without
    return True


def bump_mutation_revision(storage: Any) -> None:
    """TorchRL's storage mutation counter after a write (``_bump_mutation_revision``, torchrl >= 0.12; older
    versions have none)."""
    bump = getattr(storage, "_bump_mutation_revision", None)
    if bump is not None:
        bump()


def mutation_revision(storage: Any) -> int | None:
    """TorchRL's storage mutation counter (``_mutation_revision``, torchrl >= 0.12; a host int, or a 0-d tensor
    read once for a ``compilable`` storage), or None for a storage without one."""
    revision = getattr(storage, "_mutation_revision", None)
    if isinstance(revision, torch.Tensor):
        return int(revision)  # sync-ok: a compilable storage's host counter (a CPU tensor)
    return revision


def last_written_row(storage: Any) -> int | None:
    """The last row (dim 0) a storage's writes reached, from its ``_last_cursor`` (an int, a tensor, a range, a
    slice or a per-dimension tuple, as TorchRL's ``set`` leaves it), or None when nothing names one. Reads a
    device cursor's last value (a host sync: for rebuilds, never per step)."""
    cursor = getattr(storage, "_last_cursor", None)
    if isinstance(cursor, (tuple, list)) and cursor:
        cursor = cursor[0]
    if isinstance(cursor, slice):
        cursor = range(*cursor.indices(storage.max_size))
    if isinstance(cursor, range):
        return cursor[-1] if len(cursor) else None
    if isinstance(cursor, torch.Tensor):
        cursor = cursor.reshape(-1)
        return int(cursor[-1]) if cursor.numel() else None  # sync-ok: rebuilds only (see the docstring)
    return cursor if isinstance(cursor, int) and cursor >= 0 else None


def unlocked_len(storage: Any) -> int | None:
    """The filled length of a TorchRL ``TensorStorage`` read without its lock (its private
    ``multiprocessing.Value`` ``_len_value``; the same int that ``__len__`` reads under the lock), or None when
    there is none or the storage is ``compilable`` (``_compilable``: a plain int then): call ``__len__``."""
    value = storage.__dict__.get("_len_value")
    if value is None or storage._compilable:
        return None
    return value.get_obj().value


def tree_leaves(tree: Any) -> list:
    """The leaves of a pytree (torch's private ``torch.utils._pytree.tree_leaves``)."""
    return torch.utils._pytree.tree_leaves(tree)


def direct_writer(writer: Any) -> bool:
    """Whether a TorchRL writer keeps no write generations (its private ``_track_generations`` and
    ``_generation``), so a direct write that bypasses TorchRL's ``extend`` loses nothing."""
    return not getattr(writer, "_track_generations", False) and getattr(writer, "_generation", None) is None


def writer_cursor(writer: Any) -> int:
    """The slot a TorchRL round-robin writer writes next (its private ``_cursor`` property; a host int)."""
    return writer._cursor


def advance_writer(writer: Any, n: int, max_size: int) -> int:
    """Move a TorchRL round-robin writer by ``n`` items on a ring of ``max_size`` (its private ``_cursor`` and
    ``_write_count`` properties, as its ``extend`` does); returns the cursor before the move (a host int). Our
    writer calls it once the storage write has succeeded, so a failed write leaves both as they were."""
    cursor = writer._cursor
    writer._cursor = (cursor + n) % max_size
    writer._write_count += n
    return cursor


def bump_generation(writer: Any, index, data) -> None:
    """A TorchRL round-robin writer's ``_bump_generation(index, data)``: stamp the written slots' generations
    (torchrl >= 0.14; older writers keep none: nothing to do)."""
    bump = getattr(writer, "_bump_generation", None)
    if bump is not None:
        bump(index, data)


def mark_update_entities(writer: Any, index) -> None:
    """A TorchRL writer's ``_mark_update_entities(index)``: tell the storage's attached entities (the sampler)
    which slots were written."""
    writer._mark_update_entities(index)


def attached_entities(storage: Any):
    """The entities (replay buffers, samplers) attached to a TorchRL storage, to tell them about a write (its
    private ``_attached_entities_iter()``, what the writer's ``_mark_update_entities`` iterates)."""
    return storage._attached_entities_iter()


def is_compilable(storage: Any) -> bool:
    """Whether a TorchRL storage was built ``compilable`` (its private ``_compilable``; False when absent)."""
    return getattr(storage, "_compilable", False)


def layout_options(storage: Any) -> dict[str, bool]:
    """The layout keywords a TorchRL ``LazyTensorStorage`` was built with, to build ours alike: its ``consolidated``
    and ``shared_init`` (public attributes of the TorchRL versions that have these keywords; False in the older
    ones this package supports, which build neither)."""
    return {"consolidated": bool(getattr(storage, "consolidated", False)),
            "shared_init": bool(getattr(storage, "shared_init", False))}


def stored_data(storage: Any) -> Any:
    """What a TorchRL tensor storage holds (its private ``_storage``: a TensorDict of ``(max_size, ...)`` tensors
    once written), or None."""
    return getattr(storage, "_storage", None)


class BufferParts(NamedTuple):
    """A TorchRL replay buffer's storage, sampler and writer."""

    storage: Any
    sampler: Any
    writer: Any


def buffer_parts(rb: Any) -> BufferParts:
    """``(storage, sampler, writer)`` of a TorchRL replay buffer: its private ``_storage``, ``_sampler`` and
    ``_writer`` once initialised, else the constructor arguments a ``delayed_init`` buffer still holds
    (``_init_storage``, ``_init_sampler``, ``_init_writer``). Reads only: TorchRL's public ``storage`` /
    ``sampler`` / ``writer`` properties would initialise a delayed buffer."""
    if rb.initialized:
        return BufferParts(rb._storage, rb._sampler, rb._writer)
    return BufferParts(rb._init_storage, rb._init_sampler, rb._init_writer)


def buffer_locks(rb: Any) -> tuple[Any, Any]:
    """The two context managers TorchRL's ``ReplayBuffer.extend`` / ``sample`` / ``update_priority`` hold (its
    private ``_replay_lock``, a ``threading.RLock``, and ``_write_lock``, a lock or a null context)."""
    return rb._replay_lock, rb._write_lock


def plain_extend(rb: Any) -> bool:
    """Whether TorchRL's ``extend`` of ``rb`` only writes and marks: the buffer is initialised (no pending
    ``delayed_init``: private ``_delayed_init``), has no transform (``_transform`` empty), no ``dim_extend`` other
    than 0 (``_dim_extend``) and no consuming sampler (``_is_consuming()``, torchrl >= 0.12; older versions have
    no consuming buffers)."""
    if rb._delayed_init and not rb.initialized:
        return False
    transform = rb._transform
    if (transform is not None and len(transform)) or rb._dim_extend:
        return False
    return not getattr(rb, "_is_consuming", bool)()


def buffer_generator(rb: Any) -> torch.Generator | None:
    """The generator a TorchRL replay buffer draws with (its private ``_rng``, set by ``generator=`` or
    ``set_rng``), or None."""
    return getattr(rb, "_rng", None)


def wrapped_gym_env(env: Any) -> Any:
    """The Gymnasium env (or vector env) a TorchRL ``GymWrapper`` drives (its private ``_env``), or None."""
    return getattr(env, "_env", None)


def tracks_generations(writer: Any) -> bool:
    """Whether ``writer`` stamps write generations (TorchRL's ``Writer.tracks_generations``, torchrl >= 0.14;
    older writers have no stamps: False)."""
    return bool(getattr(writer, "tracks_generations", False))
