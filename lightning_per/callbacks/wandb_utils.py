r"""Weights & Biases without surprises: offline unless an API key is configured, run files under the run dir.

- :func:`resolve_wandb_mode`: the mode a run gets (``WANDB_MODE`` wins; else ``online`` with an API key,
  ``offline`` without).
- :class:`AutoModeWandbLogger`: Lightning's ``WandbLogger`` with that choice made at construction, usable
  from LightningCLI YAML (``logger: {class_path: lightning_per.callbacks.AutoModeWandbLogger, ...}``); an
  online run whose service cannot be reached within ``init_timeout_s`` falls back to offline with one
  warning, and the run's ``.wandb`` file is written every ``flush_interval_s`` (a kill loses at most that).
- :func:`make_wandb_logger`: the same as a function.
- :func:`run_metadata`: the package versions and the machine (no host name) that a run's W&B config records
  under ``versions.*`` and ``machine.*``.
- :func:`read_wandb_history`: the history rows of a local run, read from its ``run-<id>.wandb`` file
  (works offline; used by the tests); :func:`read_wandb_step_metrics`: its ``define_metric`` x-axes;
  :func:`read_wandb_config`: its config; :func:`read_wandb_run_id`: its run id.
  Upload an offline run later with ``wandb sync <run dir>``.
"""

from __future__ import annotations

import fnmatch
import json
import math
import netrc
import os
import platform
import struct
import time
import warnings
import zlib
from importlib import metadata
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from typing_extensions import override

from lightning_per.integrity import walk_files

__all__ = ["AutoModeWandbLogger", "make_wandb_logger", "read_wandb_config", "read_wandb_history",
           "read_wandb_run_id", "read_wandb_step_metrics", "resolve_wandb_mode", "run_metadata",
           "wandb_api_key_configured", "wandb_run_file"]

_MODES = ("online", "offline", "disabled")
_MODE_ALIASES = {"dryrun": "offline", "run": "online"}


def _netrc_paths() -> list[Path]:
    if os.environ.get("NETRC"):
        return [Path(os.environ["NETRC"]).expanduser()]
    return [Path("~/.netrc").expanduser(), Path("~/_netrc").expanduser()]


def wandb_api_key_configured() -> bool:
    """Whether W&B credentials exist: ``WANDB_API_KEY`` / ``WANDB_IDENTITY_TOKEN_FILE`` in the environment,
    or a ``.netrc`` entry (``NETRC`` or ``~/.netrc``) with a password for the host of ``WANDB_BASE_URL``
    (default ``api.wandb.ai``). Reads files only; never contacts a server."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    for path in _netrc_paths():
        if not path.is_file():
            continue
        try:
            auth = netrc.netrc(str(path)).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            continue
        if auth and auth[2]:
            return True
    return False


def resolve_wandb_mode(mode: str | None = None) -> Literal["online", "offline", "disabled"]:
    """The W&B mode to use: ``mode`` if given, else ``WANDB_MODE`` (``WANDB_DISABLED=true`` -> disabled),
    else ``"online"`` when :func:`wandb_api_key_configured`, else ``"offline"``.

    Raises:
        ValueError: ``mode`` (or ``WANDB_MODE``) is not one of ``online, offline, disabled``
            (``dryrun``/``run`` are accepted as their old aliases).
    """
    source = "mode"
    if mode is None and os.environ.get("WANDB_MODE"):
        mode, source = os.environ["WANDB_MODE"], "WANDB_MODE"
    if mode is None and os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes"):
        return "disabled"
    if mode is None:
        return "online" if wandb_api_key_configured() else "offline"
    resolved = _MODE_ALIASES.get(mode.strip().lower(), mode.strip().lower())
    if resolved not in _MODES:
        raise ValueError(f"{source} must be one of {_MODES}, got {mode!r}")
    return resolved  # type: ignore[return-value]


#: The distributions whose versions a run's config records (``versions.<name>``).
VERSIONED_PACKAGES = ("torch", "torchrl", "tensordict", "lightning", "lightning_per", "wandb", "gymnasium")


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip() or None
    except OSError:
        pass
    return platform.processor() or None


def run_metadata(query_gpus: bool = True) -> dict[str, dict[str, Any]]:
    """What a run's W&B config records besides its settings: package versions and the machine, without its
    host name.

    Args:
        query_gpus: read the GPU names (this initializes CUDA in the process); ``False`` names them only when
            CUDA is initialized already (a process that forks workers after it must not initialize CUDA).

    Returns:
        ``{"versions": {"python": ..., "torch": ..., "torchrl": ..., "tensordict": ..., "lightning": ...,
        "lightning_per": ..., "wandb": ..., "gymnasium": ...}, "machine": {"cpu": model name or None,
        "cpu_count": logical cores, "gpu": name of device 0 or None, "gpu_count": int, "arch": e.g. "x86_64",
        "os": e.g. "Linux"}}``; a package that is not installed is ``None``.

    Example::

        >>> from lightning_per.callbacks import run_metadata
        >>> meta = run_metadata(query_gpus=False)
        >>> sorted(meta), meta["versions"]["torch"] is not None
        (['machine', 'versions'], True)
    """
    import torch

    versions: dict[str, Any] = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [torch.cuda.get_device_name(i) for i in range(gpu_count)] \
        if gpu_count and (query_gpus or torch.cuda.is_initialized()) else []
    machine = {"cpu": _cpu_model(), "cpu_count": os.cpu_count(), "gpu": names[0] if names else None,
               "gpu_count": gpu_count, "arch": platform.machine() or None, "os": platform.system() or None}
    if len(set(names)) > 1:
        machine["gpus"] = names
    return {"versions": versions, "machine": machine}


class AutoModeWandbLogger(WandbLogger):
    r"""``WandbLogger`` that runs offline unless W&B credentials exist (see :func:`resolve_wandb_mode`).

    The run's files go to ``<save_dir>/wandb/``. Every ``WandbLogger`` argument is accepted (extra
    ``**kwargs`` go to ``wandb.init``); ``offline=True`` is the same as ``mode="offline"`` but, unlike
    Lightning's, does not set ``WANDB_MODE`` for the whole process.

    Without network: an online run whose start fails (``wandb.errors.CommError``: the service cannot be
    reached or refuses the key within ``init_timeout_s``) starts offline instead, with one warning naming
    the error and the offline run directory (upload it later with ``wandb sync <dir>``); training goes on.
    The W&B service buffers the run's ``.wandb`` file and writes it every ``flush_interval_s`` (wandb's
    ``x_transaction_log_flush_interval``; wandb has no call that flushes on demand), so a ``kill -9`` loses
    only the rows logged in the last ``flush_interval_s`` before it: with epochs longer than that, at most
    the last epoch's row (tests/callbacks/test_wandb_offline.py). A resumed run re-logs the rest
    (:class:`~lightning_per.callbacks.AsyncMetricsCallback`).

    Args:
        save_dir: run directory (created if missing); the wandb files land in ``save_dir/wandb``.
            ``None`` means the current directory.
        project: W&B project.
        name: display name of the run (``None``: W&B picks one).
        mode: ``online``, ``offline`` or ``disabled``; ``None`` chooses as described above.
        finish_on_end: call ``wandb.finish()`` when the Trainer finalizes the logger (end of ``fit``), so
            the run is complete on disk and a new run can start in the same process. Leave ``False`` if one
            logger serves several ``Trainer`` calls (fit, then test).
        init_timeout_s: seconds an online run may take to start (wandb's ``init_timeout``) before it falls
            back to offline.
        flush_interval_s: seconds between writes of the run's buffered records to its ``.wandb`` file
            (``0``: wandb writes only full 32 KiB blocks and at the end of the run). It needs a wandb with the
            ``x_transaction_log_flush_interval`` setting (0.31 has it); with another, one warning.
        **kwargs: the other ``WandbLogger`` / ``wandb.init`` arguments (``version``, ``log_model``,
            ``tags``, ``settings``: its ``init_timeout`` / ``x_transaction_log_flush_interval`` win over the
            two above).

    Raises:
        ValueError: an unknown ``mode``; ``init_timeout_s`` not a finite number > 0; ``flush_interval_s``
            not a finite number >= 0.

    Example (LightningCLI YAML)::

        trainer:
          logger:
            class_path: lightning_per.callbacks.AutoModeWandbLogger
            init_args: {save_dir: runs/cartpole, project: lightning_per, name: dqn-cartpole}

    Example::

        >>> import os
        >>> import tempfile
        >>> from unittest import mock
        >>> from lightning_per.callbacks import AutoModeWandbLogger, resolve_wandb_mode
        >>> with tempfile.TemporaryDirectory() as run_dir:  # no run starts before the first log call
        ...     logger = AutoModeWandbLogger(save_dir=run_dir, project="demo", mode="offline")
        ...     print(logger.save_dir == run_dir)
        True
        >>> with mock.patch.dict(os.environ, {"WANDB_MODE": "disabled"}):  # WANDB_MODE wins
        ...     resolve_wandb_mode()
        'disabled'
    """

    def __init__(self, save_dir: str | None = ".", project: str = "lightning_per", name: str | None = None,
                 mode: Literal["online", "offline", "disabled"] | None = None, finish_on_end: bool = False,
                 init_timeout_s: float = 15.0, flush_interval_s: float = 0.1, **kwargs: Any) -> None:
        if not (isinstance(init_timeout_s, (int, float)) and math.isfinite(init_timeout_s) and init_timeout_s > 0):
            raise ValueError(f"init_timeout_s must be a finite number of seconds > 0, got {init_timeout_s!r}")
        if not (isinstance(flush_interval_s, (int, float)) and math.isfinite(flush_interval_s)
                and flush_interval_s >= 0):
            raise ValueError(f"flush_interval_s must be a finite number of seconds >= 0, got {flush_interval_s!r}")
        offline = bool(kwargs.pop("offline", False))
        # LightningCLI passes every wandb.init parameter it finds, None when unset: None is wandb's own
        # default, and passing it would override WandbLogger's (e.g. resume="allow").
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        resolved = resolve_wandb_mode("offline" if offline and mode is None else mode)
        save_dir = os.fspath(save_dir) if save_dir is not None else "."
        super().__init__(name=name, save_dir=save_dir, project=project, mode=resolved, **kwargs)
        init = getattr(self, "_wandb_init", None)  # WandbLogger's wandb.init arguments
        if isinstance(init, dict) and init.get("anonymous") is None:
            init.pop("anonymous", None)  # an explicit None makes wandb >= 0.19 warn at every run (the setting is gone)
        self.mode = resolved
        self.finish_on_end = bool(finish_on_end)
        self.init_timeout_s = float(init_timeout_s)
        self.flush_interval_s = float(flush_interval_s)

    @property
    @override
    def experiment(self):
        # the run directory is made when the run starts, not here: a run refused before its first log call
        # (e.g. a bad argument in the CLI) leaves no empty directory behind; wandb falls back to a temporary
        # directory when its ``dir`` does not exist
        if self._experiment is not None or rank_zero_only.rank != 0:  # other ranks: Lightning's stand-in
            return super().experiment
        import wandb

        os.makedirs(self.save_dir or ".", exist_ok=True)
        self._wandb_init["settings"] = self._run_settings(wandb)
        if self.mode != "online":
            return super().experiment
        try:
            return super().experiment
        except (wandb.errors.CommError, TimeoutError) as err:
            # the service cannot be reached (or refused the key) within init_timeout_s: train, log offline
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            self.mode = self._wandb_init["mode"] = "offline"
            run = super().experiment
            where = run.settings.sync_dir
            warnings.warn(f"W&B could not start online ({type(err).__name__}: {reason}); logging offline to "
                          f"{where} (upload it later with `wandb sync {where}`)", stacklevel=1)
            return run

    def _run_settings(self, wandb: Any) -> Any:
        """``wandb.Settings`` for ``wandb.init``: the user's ``settings`` (a ``wandb.Settings`` or a dict), with
        ``init_timeout`` and ``x_transaction_log_flush_interval`` from this logger unless given there."""
        given = self._wandb_init.get("settings")
        ours: dict[str, Any] = {"init_timeout": self.init_timeout_s}
        if "x_transaction_log_flush_interval" in wandb.Settings.model_fields:
            ours["x_transaction_log_flush_interval"] = self.flush_interval_s
        elif self.flush_interval_s > 0:
            warnings.warn(f"wandb {metadata.version('wandb')} has no x_transaction_log_flush_interval setting: the "
                          f"run's .wandb file is written in 32 KiB blocks, and a kill can lose more than the last "
                          f"epoch (a resumed run re-logs what the file lacks)", stacklevel=1)
        if given is None or isinstance(given, dict):
            return wandb.Settings(**{**ours, **(given or {})})
        return given.model_copy(update={k: v for k, v in ours.items() if k not in given.model_fields_set})

    def continue_run(self, run_id: str) -> None:
        """Log to the W&B run ``run_id`` (a resumed training run's), with wandb's resume mechanism: ``wandb.init(
        id=run_id, resume="allow")`` (``resume="must"`` if given is kept).

        Online, the run goes on where it stopped on the server (its history, config and summary). Offline (wandb
        0.31), ``wandb.init`` reads nothing: the part writes its own ``offline-run-<time>-<run_id>`` directory,
        its run record marked resumed, and ``wandb sync <save_dir>/wandb`` uploads the parts of one id one
        after the other, in start order, into that one run. Call before the run starts (before ``Trainer.fit``).

        Args:
            run_id: the W&B run id (:attr:`version` of the earlier run's logger).

        Raises:
            ValueError: ``run_id`` is not a non-empty string without ``/ \\ # ? % :``; this logger's run already
                started under another id.
        """
        if not isinstance(run_id, str) or not run_id or any(c in run_id for c in "/\\#?%:"):
            raise ValueError(f"run_id must be a W&B run id (a non-empty string without / \\ # ? % :), got {run_id!r}")
        if self._experiment is not None:
            if self._experiment.id != run_id:
                raise ValueError(f"run_id {run_id!r}: this logger's W&B run already started as "
                                 f"{self._experiment.id!r}; continue a run before Trainer.fit starts it")
            return
        self._id = self._wandb_init["id"] = run_id
        if self._wandb_init.get("resume") != "must":
            self._wandb_init["resume"] = "allow"

    @override
    def finalize(self, status: str) -> None:
        super().finalize(status)
        if self.finish_on_end and self._experiment is not None:
            self._experiment.finish(exit_code=0 if status == "success" else 1)
            self._experiment = None


def make_wandb_logger(save_dir: str | os.PathLike[str], project: str = "lightning_per",
                      name: str | None = None, **kw: Any) -> AutoModeWandbLogger:
    """A :class:`AutoModeWandbLogger` (offline without credentials, online with; ``WANDB_MODE`` wins).

    Args:
        save_dir: run directory; wandb files go to ``save_dir/wandb``.
        project: W&B project.
        name: run display name.
        **kw: ``mode``, ``finish_on_end`` and any ``WandbLogger`` / ``wandb.init`` argument.
    """
    return AutoModeWandbLogger(save_dir=os.fspath(save_dir), project=project, name=name, **kw)


# ------------------------------------------------------------------------------- offline run reader
_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of checksummed chunks
_HEADER = struct.Struct("<4sHB")  # b":W&B", magic 0xBEE1, version 0
_CHUNK = struct.Struct("<IHB")  # crc32 (zlib, seeded with the type byte), length, type
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _iter_wandb_records(path: Path):
    data = path.read_bytes()
    if len(data) < _HEADER.size:  # created but not yet written
        return
    ident, magic, version = _HEADER.unpack_from(data, 0)
    if ident != b":W&B" or magic != 0xBEE1 or version != 0:
        raise ValueError(f"{path} is not a W&B transaction log (header {data[:7]!r})")
    off, parts = _HEADER.size, []
    while off + _CHUNK.size <= len(data):
        if _BLOCK - off % _BLOCK < _CHUNK.size:  # block trailer too short for a header: padding
            off += _BLOCK - off % _BLOCK
            continue
        crc, length, kind = _CHUNK.unpack_from(data, off)
        payload = data[off + _CHUNK.size: off + _CHUNK.size + length]
        if kind == 0 and length == 0 or len(payload) < length:
            break  # zero padding at the end of a file still being written, or a truncated tail
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: checksum mismatch at byte {off}")
        off += _CHUNK.size + length
        if kind in (_FULL, _FIRST):
            parts = [payload]
        else:
            parts.append(payload)
        if kind in (_FULL, _LAST):
            yield b"".join(parts)
            parts = []


def wandb_run_file(run: Any) -> str | None:
    """The ``run-<id>.wandb`` file a started W&B run writes (``run.settings.sync_file``), or ``None`` for a
    disabled run or anything that is not a ``wandb.Run`` (Lightning's stand-in on ranks other than 0)."""
    from wandb.wandb_run import Run

    if not isinstance(run, Run) or run.disabled:
        return None
    return os.fspath(run.settings.sync_file)


def _run_file(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if p.is_dir():
        files = sorted((f for f in walk_files(p, links="skip").values() if fnmatch.fnmatch(f.name, "run-*.wandb")),
                       key=lambda f: f.stat().st_mtime)  # wandb's own latest-run link is left out
        if not files:
            raise FileNotFoundError(f"no run-*.wandb file under {p}")
        p = files[-1]
    return p


def read_wandb_step_metrics(path: str | os.PathLike[str]) -> dict[str, str]:
    """The x-axes a local W&B run declared with ``define_metric(name_or_glob, step_metric=...)``.

    Args:
        path: as for :func:`read_wandb_history`.

    Returns:
        ``{metric name or glob: step metric name}`` for every definition that names a step metric.

    Raises:
        FileNotFoundError: no ``.wandb`` file under ``path``.
        ValueError: the file is not a W&B log or is corrupt.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    named: list[str] = []  # metrics defined by name, in order (step_metric_index counts them from 1)
    out: dict[str, str] = {}
    for raw in _iter_wandb_records(_run_file(path)):
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") != "metric":
            continue
        m = rec.metric
        if m.name:
            named.append(m.name)
        step = m.step_metric or (named[m.step_metric_index - 1] if 0 < m.step_metric_index <= len(named) else "")
        if step:
            out[m.name or m.glob_name] = step
    return out


def read_wandb_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The config of a local W&B run (what ``run.config`` held at its last update), as plain JSON values.

    Args:
        path: as for :func:`read_wandb_history`.

    Returns:
        ``{key: value}``: nested dicts as logged (``config["replay"]["alpha"]``; W&B's panels show it as
        ``replay.alpha``); wandb's own ``_wandb`` entry is left out.

    Raises:
        FileNotFoundError: no ``.wandb`` file under ``path``.
        ValueError: the file is not a W&B log or is corrupt.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    config: dict[str, Any] = {}

    def apply(record: Any) -> None:
        for item in record.update:
            keys = [item.key] if item.key else list(item.nested_key)
            value = json.loads(item.value_json)
            if isinstance(value, dict) and set(value) <= {"value", "desc"} and "value" in value:
                value = value["value"]  # the {"value": ..., "desc": ...} wrapping of config.yaml
            node = config
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = value
        for item in record.remove:
            config.pop(item.key, None)

    for raw in _iter_wandb_records(_run_file(path)):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            apply(rec.run.config)
        elif kind == "config":
            apply(rec.config)
    config.pop("_wandb", None)
    return config


def read_wandb_run_id(path: str | os.PathLike[str]) -> str:
    """The run id of a local W&B run (its run record's ``run_id``).

    Args:
        path: as for :func:`read_wandb_history`.

    Raises:
        FileNotFoundError: no ``.wandb`` file under ``path``.
        ValueError: the file is not a W&B log, is corrupt or holds no run record.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    p = _run_file(path)
    for raw in _iter_wandb_records(p):
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "run":
            return rec.run.run_id
    raise ValueError(f"{p} holds no run record")


def read_wandb_history(path: str | os.PathLike[str], timeout_s: float = 0.0) -> list[dict[str, Any]]:
    """The history rows (one per ``wandb.log`` call) of a local W&B run, oldest first.

    ``wandb.finish()`` can return before the W&B service has flushed the run's log to disk (wandb 0.31);
    with ``timeout_s > 0`` this re-reads the file until the run's exit record is there.

    Args:
        path: a ``run-<id>.wandb`` file, a run directory containing one (``.../offline-run-*``), or a
            ``wandb`` directory / a directory above it whose newest run is read.
        timeout_s: how long to wait, in seconds, for the run to be complete on disk (0: read once).

    Returns:
        One dict per row: the logged keys with their JSON values, plus W&B's ``_step``, ``_runtime``
        (seconds) and ``_timestamp`` (seconds since the epoch).

    Raises:
        FileNotFoundError: no ``.wandb`` file under ``path``.
        TimeoutError: ``timeout_s > 0`` and the run's exit record did not appear in time.
        ValueError: the file is not a W&B log or is corrupt.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    p = _run_file(path)
    deadline = time.monotonic() + timeout_s
    while True:
        rows, finished = [], False
        for raw in _iter_wandb_records(p):
            rec = pb.Record()
            rec.ParseFromString(raw)
            kind = rec.WhichOneof("record_type")
            finished = finished or kind == "exit"
            if kind == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in rec.history.item})
        if finished or timeout_s <= 0:
            return rows
        if time.monotonic() > deadline:
            raise TimeoutError(f"{p}: the run's exit record did not appear within {timeout_s} s "
                               f"({len(rows)} history rows so far)")
        time.sleep(0.05)
