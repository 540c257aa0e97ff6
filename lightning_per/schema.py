"""One schema rule for every checkpointed part: a version under one key, refuse newer, migrate older.

Every part that saves a state (the replay buffer, its storage and samplers, the DQN module's ``dqn_state``,
the callbacks, the integrity manifests) stamps its state with :func:`stamp` and reads it back through
:func:`check`:

* the version sits under :data:`SCHEMA_KEY` (``"_schema_version"``); a part that used another name before
  reads it too (``legacy_keys``): every version a state carries must be readable (a newer or unsupported
  stamp under an old name is still refused) and migrations start from the oldest;
* a version newer than this code's is refused (:class:`ValueError`, naming the part, the version found and
  the versions this code reads): upgrade lightning_per;
* an older version runs the part's registered migrations, one step at a time (``migrations[v]`` turns a
  version-``v`` state into a version-``v + 1`` one), up to the current version; an older version with no
  migration is refused the same way;
* a state without a version is read as ``missing`` (the oldest layout, where the part always read it so)
  or refused (``missing=None``).

Writes are atomic elsewhere (:mod:`lightning_per.utils`, :mod:`lightning_per.integrity`). Stdlib only.

Example::

    >>> from lightning_per.schema import check, stamp
    >>> state = stamp({"rows": 3}, "demo", 2)
    >>> state
    {'rows': 3, '_schema_version': 2}
    >>> check({"count": 3, "_schema_version": 1}, "demo", 2, {1: lambda s: {"rows": s["count"]}})
    {'rows': 3, '_schema_version': 2}
    >>> check({"_schema_version": 3}, "demo", 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: demo checkpoint schema 3 is newer than this code's (it reads 2): upgrade lightning_per
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["SCHEMA_KEY", "Migration", "check", "stamp", "version_of"]

SCHEMA_KEY = "_schema_version"

Migration = Callable[[dict[str, Any]], dict[str, Any]]


def stamp(state: dict[str, Any], part: str, version: int, *, key: str = SCHEMA_KEY) -> dict[str, Any]:
    """``state`` with ``version`` set under ``key`` (in place; returned for chaining).

    Args:
        state: the part's state dict (host values or tensors; only the key is set).
        part: the part's name, for the errors of :func:`check` (unused here; given so that every save names
            its part the way its load does).
        version: the part's current schema version, an int >= 0.
        key: :data:`SCHEMA_KEY`, or the name of a sub-part's key where two parts share one dict.

    Raises:
        ValueError: ``version`` is not an int >= 0.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"{part}: schema version must be an int >= 0, got {version!r}")
    state[key] = version
    return state


def version_of(state: Mapping[str, Any], *, key: str = SCHEMA_KEY, legacy_keys: tuple[str, ...] = (),
               missing: int | None = None) -> list[Any]:
    """Every version ``state`` carries, under ``key`` then ``legacy_keys``; ``[missing]`` when it carries none
    (``[]`` for ``missing=None``). Not validated (:func:`check` does)."""
    found = [state[k] for k in (key, *legacy_keys) if k in state]
    return found or ([] if missing is None else [missing])


def check(state: Mapping[str, Any], part: str, current: int, migrations: Mapping[int, Migration] | None = None,
          *, key: str = SCHEMA_KEY, legacy_keys: tuple[str, ...] = (), missing: int | None = None,
          label: str | None = None, error: type[ValueError] = ValueError) -> Mapping[str, Any]:
    """``state`` at version ``current``: refused if newer, migrated if older (refused without a migration).

    Args:
        state: a saved state of ``part`` (not modified; a migration returns a new dict).
        part: the part's name in errors (``"sampler"``, ``"replay"``, ``"dqn_state"``, ...).
        current: this code's schema version of the part.
        migrations: ``{v: f}``, ``f`` turning a version-``v`` state into a version-``v + 1`` state (a new
            dict); the chain from the found version to ``current`` must be complete.
        key, legacy_keys: where the version is (see :func:`version_of`).
        missing: the version of a state without one (None: such a state is refused).
        label: the words before the version in errors (default ``f"{part} checkpoint schema"``).
        error: the exception type raised (a ValueError subclass, e.g. ``IntegrityError`` for manifests).

    Returns:
        ``state`` itself when its version is ``current``, else the migrated state stamped ``current``
        (legacy keys dropped).

    Raises:
        ValueError (``error``): a version is newer than ``current``, older with no migration to ``current``,
        missing with ``missing=None``, or not an int; the message names the part, the version found and
        the versions this code reads.
    """
    label = label or f"{part} checkpoint schema"
    migrations = migrations or {}
    oldest = min((v for v in range(current + 1) if all(u in migrations for u in range(v, current))),
                 default=current)
    supported = str(current) if oldest == current else f"one of {', '.join(map(str, range(oldest, current + 1)))}"
    found = version_of(state, key=key, legacy_keys=legacy_keys, missing=missing)
    ints = [v for v in found if isinstance(v, int) and not isinstance(v, bool)]
    bad = [v for v in found if not (isinstance(v, int) and not isinstance(v, bool))] or ([] if found else [None])
    if ints and max(ints) > current:
        raise error(f"{label} {max(ints)} is newer than this code's (it reads {supported}): upgrade lightning_per")
    version = bad[0] if bad else min(ints)
    if version is None or (not bad and version < oldest and not any(k in state for k in (key, *legacy_keys))):
        raise error(f"{label} {version!r} is not supported (this code reads {supported}): the {part} state carries "
                    f"no version, so lightning_per did not write it (TorchRL's own state_dict carries none, in "
                    f"TorchRL's layout); build the {part} afresh and load its data from TorchRL's objects")
    if bad or version < oldest:
        raise error(f"{label} {version!r} is not supported (this code reads {supported}): load it with the "
                    f"lightning_per version that wrote it")
    if version == current:
        return state
    migrated = {k: v for k, v in state.items() if k not in legacy_keys}
    for v in range(version, current):
        migrated = migrations[v](migrated)
    return stamp(migrated, part, current, key=key)
