"""Integrity of everything we write to disk: manifests of SHA-256 checksums, verified before anything loads.

One rule for every checkpoint and replay dump: its parts are listed in a *manifest* (JSON) with each file's
size and SHA-256 and one *generation* id shared by all of them, and the manifest is written last,
atomically. A load verifies the manifest first and refuses, in one line naming the file and what is wrong,
a part that is missing, truncated, damaged (checksum), not listed (a file from elsewhere), or a set whose
parts belong to different generations.

* A directory (a replay buffer's ``dumps``) is written whole into a new sibling directory, its manifest
  ``MANIFEST.json`` last, and swapped into place (:func:`atomic_directory`): a reader sees the previous
  dump or the complete new one.
* A single file (a Lightning checkpoint, a DDP rank's replay shard) is written atomically (temp file +
  fsync + rename, :func:`lightning_per.utils.atomic_write`), then its manifest ``<file>.manifest.json``
  (:func:`save_file_manifest`); :func:`load_torch_file` verifies it, then loads with ``weights_only=True``.
* Leftovers of an interrupted save (``.<name>.*.tmp``, ``.<name>.*.old``) are removed at the next save of
  the same name (:func:`remove_stale`).

Manifest schema (version 1)::

    {"format": "lightning_per.manifest", "version": 1, "kind": "replay_dump" | "checkpoint" | ...,
     "generation": "<id shared by every part>", "files": {"<path relative to the manifest>":
     {"bytes": <int>, "sha256": "<hex>"}}, "meta": {...}}

A manifest of a newer version is refused (upgrade lightning_per); there is no older version
(:func:`lightning_per.schema.check`; the JSON format keeps its documented ``"version"`` key).
No Lightning dependency (the replay package uses it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from lightning_per.schema import check
from lightning_per.utils import _fsync_dir, atomic_write, atomic_write_text

__all__ = ["IntegrityError", "MANIFEST_NAME", "MANIFEST_VERSION", "atomic_directory", "file_manifest_path",
           "load_torch_file", "new_generation", "refuse_pickled_files", "remove_stale", "save_file_manifest",
           "save_torch_file", "seal_directory", "verify_directory", "verify_file", "walk_files"]

MANIFEST_NAME = "MANIFEST.json"
MANIFEST_FORMAT = "lightning_per.manifest"
MANIFEST_VERSION = 1
_CHUNK = 1 << 20


class IntegrityError(ValueError):
    """A checkpoint or dump refused by its manifest (missing, truncated, damaged, mixed or partial); the message
    names the file and what is wrong. A ValueError: a bad input, nothing was loaded or changed."""


def new_generation() -> str:
    """A fresh generation id (random, 32 hex digits)."""
    return uuid.uuid4().hex


def _sha256(path: Path, fsync: bool = False) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        if fsync:
            os.fsync(f.fileno())
    return digest.hexdigest(), size


def _manifest(kind: str, generation: str, files: Mapping[str, Path], meta: Mapping[str, Any] | None,
              fsync: bool, known: Mapping[str, tuple[str, int]] | None = None) -> str:
    entries = {}
    for rel, path in sorted(files.items()):
        sha, size = (known or {}).get(rel) or _sha256(path, fsync=fsync)
        entries[rel] = {"bytes": size, "sha256": sha}
    return json.dumps({"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "kind": kind,
                       "generation": generation, "files": entries, "meta": dict(meta or {})}, indent=1) + "\n"


def _read_manifest(path: Path, what: str, kind: str | None) -> dict[str, Any]:
    """The manifest at ``path``, its schema checked.

    Raises:
        IntegrityError: missing, not JSON, not a manifest, newer version or another kind.
    """
    if not path.is_file():
        raise IntegrityError(f"{what}: no manifest {path} (written last by every save: the save was interrupted, "
                             f"or this was not written by lightning_per)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise IntegrityError(f"{path}: damaged manifest (not JSON: {err})") from None
    except RecursionError:
        raise IntegrityError(f"{path}: damaged manifest (JSON nested deeper than Python's recursion limit)") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise IntegrityError(f"{path}: not a lightning_per manifest")
    try:  # the schema rule of every part (lightning_per.schema), under the file format's own "version" key
        check(manifest, "manifest", MANIFEST_VERSION, key="version", label="manifest version", error=IntegrityError)
    except IntegrityError as err:
        raise IntegrityError(f"{path}: {err}") from None
    if kind is not None and manifest.get("kind") != kind:
        raise IntegrityError(f"{path}: a manifest of a {manifest.get('kind')!r}, expected a {kind!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("generation"), str) or not all(
            _is_entry(e) for e in files.values()):
        raise IntegrityError(f"{path}: damaged manifest (its 'files' or 'generation' entry is malformed)")
    return manifest


def _check_entry(file: Path, entry: Mapping[str, Any]) -> None:
    if not file.is_file():
        raise IntegrityError(f"{file}: missing (listed in the manifest; the set is partial)")
    size = file.stat().st_size
    if size != entry["bytes"]:
        raise IntegrityError(f"{file}: {size} bytes, the manifest says {entry['bytes']} "
                             f"({'truncated' if size < entry['bytes'] else 'longer than written'})")
    sha, _ = _sha256(file)
    if sha != entry["sha256"]:
        raise IntegrityError(f"{file}: damaged (SHA-256 {sha[:16]}... differs from the manifest's "
                             f"{entry['sha256'][:16]}...)")


# ------------------------------------------------------------------------------------------ directories
def walk_files(root: str | os.PathLike[str], links: str = "refuse") -> dict[str, Path]:
    """Every regular file under the directory ``root``, by its POSIX path relative to ``root``; the one walk of a
    directory tree in this package (manifests, pickle refusal, "not part of the dump", W&B run directories).

    Links are never followed: ``os.walk`` does not enter a symlinked directory, so a link inside a dump would
    hide what a loader later reads through it (tensordict follows links). The walk lists entries with
    ``os.scandir`` and ``lstat``. With ``links="refuse"`` (every dump and checkpoint) it refuses, before anything
    is loaded, a ``root`` that is itself a symbolic link and any symbolic link (to a file or a directory,
    dangling or not) inside it; ``links="skip"`` leaves links out of the result (a W&B directory, whose
    ``latest-run`` link wandb makes itself). A FIFO, socket or device is refused either way.

    Raises:
        IntegrityError: naming the first refused entry (or ``root``) and what it is.
        FileNotFoundError: ``root`` is not a directory.
        ValueError: ``links`` is not ``"refuse"`` or ``"skip"``.

    Example::

        >>> import os, tempfile
        >>> from pathlib import Path
        >>> from lightning_per.integrity import IntegrityError, walk_files
        >>> with tempfile.TemporaryDirectory() as d:
        ...     (Path(d) / "sub").mkdir()
        ...     _ = (Path(d) / "sub" / "a.json").write_text("{}")
        ...     print(sorted(walk_files(d)))
        ...     os.symlink("/etc", Path(d) / "link")
        ...     try:
        ...         walk_files(d)
        ...     except IntegrityError as err:
        ...         print(str(err).split(": ", 1)[1][:38])
        ['sub/a.json']
        refused, a symbolic link (to a directo
    """
    if links not in ("refuse", "skip"):
        raise ValueError(f"links must be 'refuse' or 'skip', got {links!r}")
    root = Path(root)
    if root.is_symlink() and links == "refuse":
        raise IntegrityError(f"{root}: refused, the directory is a symbolic link (to {os.readlink(root)!r}); "
                             f"give the directory it points to")
    if not root.is_dir():
        raise FileNotFoundError(f"no directory at {root}")
    out: dict[str, Path] = {}
    pending = [root]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                path = Path(entry.path)
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode) and links == "skip":
                    continue
                if stat.S_ISLNK(mode):
                    target = os.readlink(path)
                    what = "a directory" if path.is_dir() else "a file" if path.exists() else "nothing"
                    raise IntegrityError(f"{path}: refused, a symbolic link (to {what}, {target!r}); a dump holds "
                                         f"regular files and directories only, links are never followed")
                if stat.S_ISDIR(mode):
                    pending.append(path)
                elif stat.S_ISREG(mode):
                    out[path.relative_to(root).as_posix()] = path
                else:
                    raise IntegrityError(f"{path}: refused, not a regular file (a FIFO, socket or device); a dump "
                                         f"holds regular files and directories only")
    return out


def _files_under(root: Path) -> dict[str, Path]:
    return {rel: path for rel, path in walk_files(root).items() if rel != MANIFEST_NAME}


#: what the loaders of a dump read without unpickling: JSON, raw memory-mapped arrays, and ``.pt`` files that they
#: open with ``torch.load(weights_only=True)``
SAFE_SUFFIXES = frozenset({".json", ".memmap", ".pt"})


def refuse_pickled_files(path: str | os.PathLike[str], allowed: frozenset[str] = SAFE_SUFFIXES) -> None:
    """Refuse a directory holding a file its loaders would unpickle (tensordict's memory-mapped format keeps
    non-tensor fields it cannot write as JSON in ``*.pickle`` files, TorchRL's buffers their prefetch queue in
    ``prefetch.pkl``): a manifest proves a file unchanged, not harmless, since anyone can recompute it.

    Raises:
        IntegrityError: naming the first file under ``path`` whose suffix is not in ``allowed``.

    Example::

        >>> import tempfile
        >>> from pathlib import Path
        >>> from lightning_per.integrity import refuse_pickled_files
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = (Path(d) / "meta.json").write_text("{}")
        ...     refuse_pickled_files(d)  # nothing to refuse
    """
    root = Path(path)
    for _, file in sorted(_files_under(root).items()):
        if file.suffix not in allowed:
            raise IntegrityError(f"{file}: refused, a dump is loaded without unpickling anything (its files are "
                                 f"{', '.join(sorted(allowed))}); this one may hold pickled objects")


def verify_directory(path: str | os.PathLike[str], kind: str | None = None) -> dict[str, Any]:
    """Check a directory written by :func:`atomic_directory` against its manifest; returns the manifest.

    Raises:
        FileNotFoundError: ``path`` is not a directory (naming a leftover of an interrupted swap if any).
        IntegrityError: as :func:`_read_manifest`; a listed file missing, truncated or damaged; a file that the
            manifest does not list (e.g. a part copied in from another dump, or a ``prefetch.pkl``); a symbolic
            link, FIFO, socket or device anywhere in the directory, or the directory itself a link
            (:func:`walk_files`).
    """
    root = Path(path).absolute()
    if not root.is_dir():
        leftovers = sorted(p.name for p in root.parent.glob(f".{root.name}.*")) if root.parent.is_dir() else []
        hint = f" (an interrupted save left {leftovers} next to it)" if leftovers else ""
        raise FileNotFoundError(f"no dump directory at {root}{hint}")
    present = _files_under(root)  # refuses links and special files before any file is read
    manifest = _read_manifest(root / MANIFEST_NAME, str(root), kind)
    listed = manifest["files"]
    for rel, entry in listed.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise IntegrityError(f"{root / MANIFEST_NAME}: damaged manifest (entry {rel!r} leaves the directory)")
        if rel not in present:
            raise IntegrityError(f"{root / rel}: missing (listed in the manifest; the set is partial)")
        _check_entry(present[rel], entry)
    extra = sorted(set(present) - set(listed))
    if extra:
        raise IntegrityError(f"{root / extra[0]}: not part of the dump (not in its manifest; files from another "
                             f"dump or a partial copy)")
    return manifest


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0


def remove_stale(target: str | os.PathLike[str]) -> list[Path]:
    """Remove leftovers of interrupted saves of ``target``: ``.<name>.<8 characters>.tmp`` / ``.old`` next to it
    (temp files of :func:`lightning_per.utils.atomic_write`, and of the manifest next to ``target``, staging and
    swapped-out directories of :func:`atomic_directory`). Other files' temp names never match (another file's
    name is in them: ``.last.ckpt.rank1.replay.pt.x.tmp`` is not ``last.ckpt``'s). Returns what was removed."""
    target = Path(target).absolute()
    removed: list[Path] = []
    if not target.parent.is_dir():
        return removed
    names = (re.escape(target.name), re.escape(file_manifest_path(target).name))
    pattern = re.compile(rf"^\.(?:{'|'.join(names)})\.[A-Za-z0-9_]{{8}}\.(?:tmp|old)$")
    for path in target.parent.iterdir():
        if not pattern.match(path.name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(path)
    return removed


def seal_directory(path: str | os.PathLike[str], kind: str, meta: Mapping[str, Any] | None = None,
                   generation: str | None = None, fsync: bool = False) -> dict[str, Any]:
    """Write the manifest of every file now under the directory ``path`` (``MANIFEST.json``, atomically) and
    return it: what :func:`atomic_directory` does last. ``fsync`` also flushes every file to disk first."""
    root = Path(path).absolute()
    text = _manifest(kind, generation or new_generation(), _files_under(root), meta, fsync=fsync)
    atomic_write_text(root / MANIFEST_NAME, text)
    _fsync_dir(root)
    return json.loads(text)


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike[str], kind: str, meta: Mapping[str, Any] | None = None,
                     generation: str | None = None) -> Iterator[Path]:
    """Write a directory as a whole: yields an empty staging directory next to ``target``; when the block
    ends without error, a manifest of every file in it (``MANIFEST.json``, written last) is added and the
    staging directory replaces ``target`` (an atomic exchange on Linux, else two renames), the previous
    content is removed. On an error, ``target`` is untouched and the staging directory removed.

    Raises:
        ValueError: ``target`` exists and is not a directory this function wrote (no manifest inside, and not
            empty): replacing it would delete files that are not a dump; ``target`` is a symbolic link (dangling
            or not), or holds one, a FIFO, socket or device anywhere inside (:func:`walk_files`): the exchange would
            put a real directory where the link was and leave the link behind, and a dump never holds one.
            Refused before anything is written or removed.
    """
    target = Path(target).absolute()
    if target.is_symlink():
        raise ValueError(f"{target}: refused, a symbolic link (to {os.readlink(target)!r}): a dump replaces a real "
                         f"directory; give the directory it points to, or a new path (nothing was written)")
    if target.is_dir():
        try:
            walk_files(target)
        except IntegrityError as err:
            raise ValueError(f"{target} is not a dump this package wrote, so a dump will not replace it: {err} "
                             f"(nothing was written)") from None
    if target.exists() and (not target.is_dir() or (any(target.iterdir())
                                                     and not (target / MANIFEST_NAME).is_file())):
        raise ValueError(f"{target} exists and is not a dump directory (no {MANIFEST_NAME}): a dump replaces the "
                         f"whole directory; give a new path or an earlier dump's")
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    os.chmod(staging, 0o777 & ~_umask())
    try:
        yield staging
        seal_directory(staging, kind, meta, generation, fsync=True)
        if target.exists() and _exchange(staging, target):
            old = staging  # now holds the previous dump
        else:
            old = None
            if target.exists():
                old = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.old"
                os.replace(target, old)
            os.replace(staging, target)
        _fsync_dir(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
        raise


def _umask() -> int:
    from lightning_per.utils import _umask as umask

    return umask()


# ------------------------------------------------------------------------------------------ single files
def file_manifest_path(path: str | os.PathLike[str]) -> Path:
    """Where the manifest of the single file ``path`` lives: ``<path>.manifest.json``."""
    return Path(f"{os.fspath(path)}.manifest.json")


def save_file_manifest(path: str | os.PathLike[str], kind: str, generation: str,
                       meta: Mapping[str, Any] | None = None, digest: tuple[str, int] | None = None,
                       previous: Mapping[str, Any] | None = None) -> Path:
    """Write the manifest of the file ``path``, atomically: its size, SHA-256 and ``generation`` (``digest``:
    ``(sha256 hex, bytes)`` of the content, else read back from the file).

    ``previous``: the manifest of the content ``path`` holds until a pending rename replaces it (see
    :func:`save_torch_file`); kept under the key ``"previous"``, so that :func:`verify_file` accepts either.
    """
    path = Path(path)
    known = {path.name: digest} if digest is not None else None
    text = _manifest(kind, generation, {path.name: path}, meta, False, known)
    if previous is not None:
        manifest = json.loads(text)
        manifest["previous"] = {k: previous[k] for k in ("generation", "files", "meta") if k in previous}
        text = json.dumps(manifest, indent=1) + "\n"
    return atomic_write_text(file_manifest_path(path), text)


def _current_manifest(path: Path, kind: str) -> dict[str, Any] | None:
    """The manifest of the content now at ``path`` if it has a well-formed one of ``kind``, else None. The file is
    hashed only when the last save was interrupted (its manifest lists a ``"previous"`` content: which of the two
    is on disk decides)."""
    if not path.is_file():
        return None
    try:
        manifest = _read_manifest(file_manifest_path(path), str(path), kind)
        return verify_file(path, kind) if "previous" in manifest else manifest
    except IntegrityError:
        return None


def verify_file(path: str | os.PathLike[str], kind: str | None = None) -> dict[str, Any]:
    """Check the single file ``path`` against its manifest (see :func:`save_file_manifest`); returns it.

    A manifest written by :func:`save_torch_file` in the window before its rename also lists the content being
    replaced (``"previous"``): the file matching that entry is accepted, and the returned manifest is the
    previous one (its generation and meta).

    The manifest names the file it sealed; a copy of both under other names (``cp last.ckpt bak.ckpt; cp
    last.ckpt.manifest.json bak.ckpt.manifest.json``) is accepted when its size and SHA-256 are those sealed (the
    content is the one sealed; the checksums authenticate nothing, so the name would add no protection).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IntegrityError: no manifest, or the file is truncated, damaged or not the one the manifest lists.
    """
    path = Path(path)
    if path.is_symlink():
        raise IntegrityError(f"{path}: refused, a symbolic link (to {os.readlink(path)!r}); give the file itself")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    manifest = _read_manifest(file_manifest_path(path), str(path), kind)
    if len(manifest["files"]) != 1:
        raise IntegrityError(f"{file_manifest_path(path)}: is the manifest of {sorted(manifest['files'])}, "
                             f"not of {path.name}")
    (sealed, entry), = manifest["files"].items()  # a copy (bak.ckpt of last.ckpt's manifest): checked by content
    candidates = [(entry, manifest)]
    previous = manifest.get("previous")
    if isinstance(previous, dict) and isinstance(previous.get("generation"), str) and isinstance(
            previous.get("files"), dict) and _is_entry(previous["files"].get(sealed)):
        candidates.append((previous["files"][sealed], {**manifest, "generation": previous["generation"],
                                                       "files": dict(previous["files"]),
                                                       "meta": previous.get("meta", {})}))
    size, sha = path.stat().st_size, None
    for candidate, listed in candidates:
        if size == candidate["bytes"]:
            sha = sha or _sha256(path)[0]
            if sha == candidate["sha256"]:
                listed.pop("previous", None)
                return listed
    if sealed != path.name:
        differs = (f"{size} bytes, the manifest says {entry['bytes']}" if size != entry["bytes"] else
                   f"SHA-256 {sha[:16]}... differs from the manifest's {entry['sha256'][:16]}...")
        raise IntegrityError(f"{file_manifest_path(path)}: is the manifest of {sealed}, and {path.name} does not hold "
                             f"the content sealed there ({differs}; a copy is accepted when the file and its "
                             f"manifest are copied together)")
    _check_entry(path, entry)  # raises: names what differs from the manifest's (new) entry
    return manifest


def _is_entry(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str)


def save_torch_file(obj: Any, path: str | os.PathLike[str], kind: str, generation: str,
                    meta: Mapping[str, Any] | None = None) -> Path:
    """``torch.save(obj, path)`` with its manifest, such that a crash at any instant leaves ``path`` loadable by
    :func:`load_torch_file` as the previous content or the new one (stale temp files of ``path`` removed first).

    The steps: the new content to a temporary file next to ``path`` (fsynced); the manifest of the new content,
    still listing the current one as ``"previous"``; the rename of the temporary file onto ``path``; the
    manifest again without ``"previous"``. Each step is atomic, and between any two of them the file on disk
    matches an entry of the manifest on disk.

    Raises:
        ValueError: ``path`` is a URL or a directory.

    Example::

        >>> import os, tempfile
        >>> from lightning_per.integrity import load_torch_file, save_torch_file
        >>> with tempfile.TemporaryDirectory() as d:
        ...     save_torch_file({"step": 1}, os.path.join(d, "x.pt"), "checkpoint", "g1")
        ...     save_torch_file({"step": 2}, os.path.join(d, "x.pt"), "checkpoint", "g2")
        ...     obj, manifest = load_torch_file(os.path.join(d, "x.pt"), "checkpoint")
        ...     print(obj, manifest["generation"], sorted(os.listdir(d)))
        {'step': 2} g2 ['x.pt', 'x.pt.manifest.json']
    """
    import io

    import torch

    target = Path(path)
    remove_stale(target)
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getbuffer()
    digest = (hashlib.sha256(data).hexdigest(), data.nbytes)
    previous = _current_manifest(target, kind)

    def swap(tmp: Path) -> None:  # the temp file is complete and fsynced; atomic_write renames it after this
        save_file_manifest(target, kind, generation, meta, digest, previous=previous)

    atomic_write(target, lambda f: f.write(data), before_rename=swap)
    save_file_manifest(target, kind, generation, meta, digest)
    return target


def load_torch_file(path: str | os.PathLike[str], kind: str | None = None,
                    map_location: Any = "cpu") -> tuple[Any, dict[str, Any]]:
    """``(torch.load(path, weights_only=True), manifest)`` once the file matches its manifest.

    Raises:
        FileNotFoundError, IntegrityError: as :func:`verify_file`; IntegrityError also when the verified file
            is not a torch file of plain data (``weights_only`` refuses it).
    """
    import pickle

    import torch

    manifest = verify_file(path, kind)
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        raise IntegrityError(f"{path}: not a torch file of plain data (it holds objects other than tensors, numbers, "
                             f"strings and containers; refused without running them)") from None
    except (RuntimeError, EOFError, OSError) as err:
        raise IntegrityError(f"{path}: not a torch file of plain data ({type(err).__name__}: "
                             f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
    return obj, manifest
