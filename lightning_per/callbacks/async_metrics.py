r"""Epoch-level metrics read back from the device without stalling the training loop.

The LightningModule accumulates its metrics in device tensors (``pl_module.metrics``, see
:class:`~lightning_per.metrics.MetricAccumulator`). Once an epoch this callback takes a snapshot,
copies it into pinned host memory on a side CUDA stream and logs it when the copy has landed:

.. code-block:: text

    on_train_epoch_end   compute_stacked() -> (M,) float64 on the device
                         [DDP: all_gather (W, M) -> reduce per metric, on the device]
                         side stream waits on the current stream, copy -> pinned host (non_blocking),
                         record an event, keep the source alive, reset the accumulator
    next hooks           event.query() (never blocks); when done: history, loggers, progress bar
    on_train_end /       event.synchronize() for whatever is still in flight (drain)
    on_exception /
    state_dict()

At most one host synchronisation per epoch (the drain before a checkpoint, or ``sync_at_epoch_end=True``),
none inside training steps. CPU modules use a plain copy.

Episodes: when the module keeps an episode log (``episode_log`` / ``episode_log_count``, see
:mod:`lightning_per.metrics.episodes`), the same snapshot copies it, and publishing turns the episodes
that ended since the last snapshot into rows of :attr:`AsyncMetricsCallback.episodes`, one per episode,
each sent to the loggers (W&B: keys ``episode/*`` plotted against ``episode/env_steps``).

Resume and W&B: the checkpointed state names the W&B run (:meth:`AsyncMetricsCallback.wandb_run_id_in`; the
``lightning-per fit`` command continues it, :meth:`~lightning_per.callbacks.AutoModeWandbLogger.continue_run`) and
the ``.wandb`` files its rows were logged to. A resumed run (the same W&B run continued, or a new one) reads those
files and logs, first thing, the epochs and episodes of the restored history that none of them holds (what a kill
cut from a file's unwritten tail), with one INFO line, and nothing they hold: each epoch is in the W&B run once.
When a file cannot be read, or the checkpoint names none, one warning says which epochs may be missing instead.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks.callback import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor
from typing_extensions import override

from lightning_per.callbacks.host_copy import HostCopy, copy_to_host
from lightning_per.callbacks.wandb_utils import read_wandb_history, wandb_run_file
from lightning_per.metrics.episodes import episode_log_rows
from lightning_per.metrics.ranks import DEFAULT_RANK_OP, RANK_OPS, reduce_across_ranks
from lightning_per.schema import check, stamp

__all__ = ["AsyncMetricsCallback"]

_STATE_SCHEMA_VERSION = 1
#: How :func:`lightning_per.schema.check` reads the state: the version was ``"version"`` before, and a state
#: without one is the first layout.
_STATE_SCHEMA = {"legacy_keys": ("version",), "missing": 1, "label": "AsyncMetricsCallback state version"}
#: The keys of a history row that are not metrics (the rest are logged as ``prefix + name``).
_INFO_KEYS = ("epoch", "global_step", "time_s", "epoch_time_s")


class AsyncMetricsCallback(Callback):
    r"""Log ``pl_module.metrics`` once per training epoch to every logger, with no per-step host sync.

    Each epoch becomes one history row ``{"epoch", "global_step", "time_s", "epoch_time_s", <metrics>}``
    (metric values are Python floats; NaN where the metric had no observation), appended to
    :attr:`history` and sent to ``logger.log_metrics`` of every ``trainer.loggers`` (global rank 0
    only) under ``prefix + name``. The values also go to the progress bar (host floats, so the bar
    never reads a device tensor) and to ``trainer.callback_metrics`` (0-d CPU tensors, so
    ``ModelCheckpoint(monitor="train/...")`` and ``EarlyStopping`` can use them). Because the copy is
    asynchronous they appear during the next epoch; set ``sync_at_epoch_end=True`` when a monitor must
    see an epoch's values at that epoch's end (one host sync per epoch).

    Under DDP the snapshot is all-gathered and reduced on the device once per epoch (see
    :func:`reduce_across_ranks`): by default ``mean``/``last`` metrics are averaged over ranks, ``sum``
    summed, ``max``/``min`` taken; override per metric with ``rank_ops``.

    Episodes (modules with an episode log, :mod:`~lightning_per.metrics.episodes`): each episode that
    ended becomes a row ``{"episode", "env_steps", "time_s", "return", "return_mean"}`` of
    :attr:`episodes` (``return_mean``: mean of the newest ``return_window`` returns up to it; ``time_s``
    on the history's clock), sent to every logger as ``episode/<key>`` (W&B: with ``episode/env_steps``
    as the step metric of ``episode/*`` and, when the module logs ``env_steps``, ``<prefix>env_steps``
    that of ``<prefix>*``, both set with ``wandb.define_metric``; other loggers: ``step`` = env steps).
    Under DDP the rows are global rank 0's episodes.

    Args:
        prefix: prepended to each metric name for loggers and ``callback_metrics`` (not for the
            progress bar, which shows short names).
        step: what ``log_metrics`` receives as ``step``: ``"global_step"`` (optimizer steps at the
            epoch end) or ``"epoch"`` (the epoch index, 0-based).
        prog_bar: show every metric (``True``), none (``False``), or the listed names.
        sync_at_epoch_end: wait for the copy at each epoch end instead of polling at later hooks.
        rank_ops: metric name -> ``mean|sum|max|min``, how DDP ranks are combined.
        return_window: episodes averaged into each episode row's ``return_mean``.

    Raises:
        ValueError: ``step`` or a ``rank_ops`` value is not one of the choices, or ``return_window < 1``.
        TypeError: ``prog_bar`` is neither a bool nor a sequence of names; at ``setup``, the module has
            no ``metrics`` attribute with ``compute()`` and ``reset()``.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning.pytorch.demos.boring_classes import BoringModel
        >>> from lightning_per.metrics import MetricAccumulator
        >>> from lightning_per.callbacks import AsyncMetricsCallback
        >>> class Model(BoringModel):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.metrics = MetricAccumulator({"loss": "mean", "steps": "sum"})
        ...     def training_step(self, batch, batch_idx):
        ...         out = super().training_step(batch, batch_idx)
        ...         self.metrics.add("loss", out["loss"].detach())  # in place, on the device: no sync
        ...         self.metrics.add("steps", 1.0)
        ...         return out
        >>> cb = AsyncMetricsCallback(prog_bar=False)
        >>> trainer = Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=0, logger=False,
        ...                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        ...                   callbacks=[cb])
        >>> trainer.fit(Model())
        >>> [(row["epoch"], row["global_step"], row["steps"]) for row in cb.history]
        [(0, 3, 3.0), (1, 6, 3.0)]
    """

    def __init__(
        self,
        prefix: str = "train/",
        step: Literal["global_step", "epoch"] = "global_step",
        prog_bar: bool | Sequence[str] = True,
        sync_at_epoch_end: bool = False,
        rank_ops: dict[str, str] | None = None,
        return_window: int = 20,
    ) -> None:
        if int(return_window) < 1:
            raise ValueError(f"return_window must be >= 1, got {return_window}")
        if step not in ("global_step", "epoch"):
            raise ValueError(f"step must be 'global_step' or 'epoch', got {step!r}")
        if not isinstance(prog_bar, bool) and (
            isinstance(prog_bar, str) or not all(isinstance(n, str) for n in prog_bar)
        ):
            raise TypeError(f"prog_bar must be a bool or a list of metric names, got {prog_bar!r}")
        rank_ops = dict(rank_ops or {})
        bad = {k: v for k, v in rank_ops.items() if v not in RANK_OPS}
        if bad:
            raise ValueError(f"rank_ops values must be one of {RANK_OPS}, got {bad}")
        self.prefix = str(prefix)
        self.step = step
        self.prog_bar = prog_bar if isinstance(prog_bar, bool) else tuple(prog_bar)
        self.sync_at_epoch_end = bool(sync_at_epoch_end)
        self.rank_ops = rank_ops
        self._history: list[dict[str, float]] = []
        self._pending: list[HostCopy] = []
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._t0: float | None = None  # time.monotonic() at the start of this run, minus resumed time
        self._epoch_t0: float | None = None
        self._resumed_time_s = 0.0
        self._trainer: pl.Trainer | None = None  # set between setup and teardown, for flush()
        self.return_window = int(return_window)
        self._episodes: list[dict[str, float]] = []
        self._episodes_seen = 0  # episode count of the log at the last publish
        self.episodes_dropped = 0  # episodes overwritten in the module's log before a snapshot read them
        self._wandb_defined: set[int] = set()  # ids of the W&B runs given their step metrics
        # the .wandb files of the W&B runs the history was logged to, oldest first (None: a restored state that
        # does not say)
        self._wandb_files: list[str] | None = []
        self._wandb_run_id: str | None = None  # id of the W&B run logged to last

    # ----------------------------------------------------------------------------------- public API
    @property
    def history(self) -> list[dict[str, float]]:
        """One dict per logged epoch, oldest first (a copy). Times in seconds (``time.monotonic``)."""
        return [dict(row) for row in self._history]

    @property
    def episodes(self) -> list[dict[str, float]]:
        """One dict per finished episode read so far, oldest first (a copy): ``episode`` (0-based index),
        ``env_steps``, ``time_s`` (seconds on the history's clock), ``return``, ``return_mean``."""
        return [dict(row) for row in self._episodes]

    @property
    def pending(self) -> int:
        """Number of snapshots copied but not yet logged."""
        return len(self._pending)

    @property
    def wandb_run_id(self) -> str | None:
        """Id of the W&B run this callback logged to last (restored from a checkpoint until the run starts);
        ``None`` before any W&B run."""
        return self._wandb_run_id

    def wandb_run_id_in(self, checkpoint: Mapping[str, Any]) -> str | None:
        """The W&B run id that this callback's state in ``checkpoint`` (a loaded Lightning checkpoint) names:
        what a resume gives :meth:`AutoModeWandbLogger.continue_run <lightning_per.callbacks.AutoModeWandbLogger.
        continue_run>` to continue that run. ``None`` when the checkpoint holds no state of this callback or names
        no run (written before the run id was recorded, or without W&B).

        Raises:
            ValueError: the state's ``wandb_run_id`` is neither a string nor None.

        Example::

            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            run_id = metrics_callback.wandb_run_id_in(checkpoint)
            if run_id is not None:
                wandb_logger.continue_run(run_id)
            trainer.fit(model, ckpt_path=path)
        """
        states = checkpoint.get("callbacks")
        state = states.get(self.state_key) if isinstance(states, Mapping) else None
        run_id = state.get("wandb_run_id") if isinstance(state, Mapping) else None
        if run_id is not None and not isinstance(run_id, str):
            raise ValueError(f"AsyncMetricsCallback state: wandb_run_id must be a string or None, got {run_id!r}")
        return run_id or None

    def flush(self, trainer: pl.Trainer | None = None) -> None:
        """Wait for every snapshot in flight (one host sync) and publish it. Safe to call any time.

        Args:
            trainer: where to publish; defaults to the trainer seen at ``setup`` (none: history only).
        """
        trainer = trainer if trainer is not None else self._trainer
        while self._pending:
            item = self._pending.pop(0)
            item.wait()
            self._publish(item, trainer)

    def poll(self, trainer: pl.Trainer | None = None) -> None:
        """Publish, in order, the snapshots whose copy has completed; never blocks."""
        trainer = trainer if trainer is not None else self._trainer
        while self._pending and self._pending[0].ready():
            self._publish(self._pending.pop(0), trainer)

    # ---------------------------------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Check the module's accumulator (``fit`` only)."""
        if stage != "fit":
            return
        self._trainer = trainer
        metrics = getattr(pl_module, "metrics", None)
        if not (callable(getattr(metrics, "compute", None)) and callable(getattr(metrics, "reset", None))):
            raise TypeError(
                f"AsyncMetricsCallback needs `pl_module.metrics` with compute() and reset() "
                f"(e.g. a MetricAccumulator); {type(pl_module).__name__}.metrics is {type(metrics).__name__}"
            )

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.flush(trainer)
        self._trainer = None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the clock of time_s starts here (before the module's own on_fit_start: episodes may end before
        # the first training batch, e.g. GA3C's agents start there)
        self._t0 = time.monotonic() - self._resumed_time_s
        count = getattr(pl_module, "episode_log_count", None)
        if isinstance(count, Tensor):  # a log that is not checkpointed starts again at 0 on resume
            self._episodes_seen = int(count)  # sync-ok: once, at fit start

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._t0 is None:
            self._t0 = time.monotonic() - self._resumed_time_s
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                if isinstance(logger, WandbLogger):
                    if self._history or self._episodes:
                        self._relog_missing(logger)
                    else:
                        self._note_wandb_file(logger)
        metrics_device = torch.device(getattr(pl_module.metrics, "device", pl_module.device))
        if metrics_device.type == "cuda":
            # Creating a stream and first launches of kernels (CUDA lazy loading) synchronize the device,
            # unseen by set_sync_debug_mode: pay for them here, once, by one snapshot that is discarded.
            self._side_stream(metrics_device)
            self._snapshot(trainer, pl_module).wait()

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        return stream

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_t0 = time.monotonic()
        self.poll(trainer)

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._pending:
            self.poll(trainer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.poll(trainer)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.poll(trainer)
        self._pending.append(self._snapshot(trainer, pl_module))
        pl_module.metrics.reset()
        if self.sync_at_epoch_end:
            self.flush(trainer)
        else:
            self.poll(trainer)  # CPU snapshots are ready at once; CUDA ones usually publish later

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.flush(trainer)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        try:
            self.flush(trainer)
        except Exception as err:  # a CUDA error may have poisoned the context; keep the original error
            warnings.warn(f"AsyncMetricsCallback: dropped {len(self._pending)} unlogged epoch(s): {err}",
                          stacklevel=2)
            self._pending.clear()

    @override
    def state_dict(self) -> dict[str, Any]:
        """History of logged epochs (snapshots in flight are drained first, so none is lost)."""
        self.flush()
        return stamp({"history": self.history, "episodes": self.episodes, "episodes_seen": self._episodes_seen,
                      "episodes_dropped": self.episodes_dropped, "wandb_files": self._wandb_files,
                      "wandb_run_id": self._wandb_run_id},
                     "AsyncMetricsCallback", _STATE_SCHEMA_VERSION)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; later epochs continue the history and its clock.

        Raises:
            ValueError: a newer or unknown schema version (:func:`lightning_per.schema.check`); ``wandb_files``
                not a list of strings, ``wandb_run_id`` neither a string nor None (nothing is restored then).
        """
        state_dict = check(state_dict, "AsyncMetricsCallback", _STATE_SCHEMA_VERSION, **_STATE_SCHEMA)
        files = state_dict.get("wandb_files")  # checked before anything is restored
        if files is not None and not (isinstance(files, list) and all(isinstance(f, str) for f in files)):
            raise ValueError(f"AsyncMetricsCallback state: wandb_files must be a list of paths, got {files!r}")
        run_id = state_dict.get("wandb_run_id")  # absent from states written before it was recorded
        if run_id is not None and not isinstance(run_id, str):
            raise ValueError(f"AsyncMetricsCallback state: wandb_run_id must be a string or None, got {run_id!r}")
        self._history = [dict(row) for row in state_dict.get("history", [])]
        self._episodes = [dict(row) for row in state_dict.get("episodes", [])]
        self._episodes_seen = int(state_dict.get("episodes_seen", len(self._episodes)))
        self.episodes_dropped = int(state_dict.get("episodes_dropped", 0))
        self._wandb_files = None if files is None else list(files)
        self._wandb_run_id = run_id
        self._resumed_time_s = float(self._history[-1].get("time_s", 0.0)) if self._history else 0.0

    # ------------------------------------------------------------------------------------ internals
    def _snapshot(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> HostCopy:
        """Enqueue the device->host copy of this epoch's metrics; no host sync on CUDA."""
        metrics = pl_module.metrics
        if callable(getattr(metrics, "compute_stacked", None)):
            names, values = metrics.compute_stacked()  # (M,) on the module's device
        else:
            d = metrics.compute()
            names, values = list(d), torch.stack([torch.as_tensor(v).reshape(()) for v in d.values()])
        names = list(names)
        values = values.detach().to(torch.float64)
        if trainer.world_size > 1:
            kinds = getattr(metrics, "kinds", {})
            ops = [self.rank_ops.get(n, DEFAULT_RANK_OP.get(kinds.get(n, "mean"), "mean")) for n in names]
            values = reduce_across_ranks(trainer.strategy.all_gather(values).reshape(-1, len(names)), ops)
        now = time.monotonic()
        info = {
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "time_s": now - (self._t0 if self._t0 is not None else now),
            "epoch_time_s": now - (self._epoch_t0 if self._epoch_t0 is not None else now),
        }
        log = getattr(pl_module, "episode_log", None)
        count = getattr(pl_module, "episode_log_count", None)
        episodes = (log, count) if isinstance(log, Tensor) and isinstance(count, Tensor) else None
        stream = self._side_stream(values.device) if values.device.type == "cuda" else None
        return copy_to_host(names, values, info, episodes, stream)

    def _publish(self, item: HostCopy, trainer: pl.Trainer | None) -> None:
        floats = item.host.tolist()  # sync-ok: pinned host buffer, its copy event has completed
        item.source = None
        metrics = dict(zip(item.names, floats))
        row = {**item.info, **metrics}
        self._history.append(row)
        new_episodes = self._read_episodes(item)
        if trainer is None:
            return
        logged = {f"{self.prefix}{k}": v for k, v in metrics.items()}
        logged["epoch"] = item.info["epoch"]
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                if isinstance(logger, WandbLogger):
                    self._define_wandb_steps(logger, item.names, item.episodes is not None)
                    self._note_wandb_file(logger)
                self._log_rows(logger, new_episodes, [row])
        # trainer.callback_metrics / progress_bar_metrics are the live dicts behind public properties.
        trainer.callback_metrics.update(
            {k: torch.tensor(v, dtype=torch.float64) for k, v in logged.items() if k != "epoch"})
        if self.prog_bar:
            names = metrics if self.prog_bar is True else [k for k in self.prog_bar if k in metrics]
            shown = {k: metrics[k] for k in names}
            bar = trainer.progress_bar_metrics
            for k, v in shown.items():  # NaN (no observation this epoch) hides the entry
                if math.isnan(v):
                    bar.pop(k, None)
                else:
                    bar[k] = v

    def _log_rows(self, logger: Any, episodes: list[dict[str, float]], rows: list[dict[str, float]]) -> None:
        """Send episode rows, then history rows (``{**info, **metrics}``), to one logger, oldest first."""
        wandb = isinstance(logger, WandbLogger)
        for episode in episodes:
            logger.log_metrics({f"episode/{k}": v for k, v in episode.items()},
                               step=None if wandb else int(episode["env_steps"]))
        for row in rows:
            logged = {f"{self.prefix}{k}": v for k, v in row.items() if k not in _INFO_KEYS}
            logged["epoch"] = row["epoch"]
            logger.log_metrics(logged, step=int(row["global_step"] if self.step == "global_step" else row["epoch"]))
        logger.save()

    def _note_wandb_file(self, logger: WandbLogger) -> None:
        """Remember the logger's run id and ``.wandb`` file (what a resume continues, and reads to find what it
        lacks)."""
        run = logger.experiment
        path = wandb_run_file(run)
        if path is None:
            return
        self._wandb_run_id = run.id
        if self._wandb_files is not None and path not in self._wandb_files:
            self._wandb_files.append(path)

    def _relog_missing(self, logger: WandbLogger) -> None:
        """Log to the logger's run (the earlier one continued, or a new one) the restored epochs and episodes that
        no earlier ``.wandb`` file holds."""
        current = wandb_run_file(logger.experiment)
        if current is None:  # a disabled run: nothing to complete
            return
        epochs = [int(row["epoch"]) for row in self._history]
        if self._wandb_files is None:
            warnings.warn(f"AsyncMetricsCallback: the checkpoint does not name the W&B runs it was logged to; epochs "
                          f"{_spans(epochs)} are not re-logged to {current} and may be missing from W&B", stacklevel=2)
            self._wandb_files = []
            self._note_wandb_file(logger)
            return
        have_epochs: set[int] = set()
        have_episodes: set[int] = set()
        unreadable = []
        for path in (f for f in self._wandb_files if f != current):
            try:
                rows = read_wandb_history(path)
            except (OSError, ValueError) as err:
                unreadable.append(f"{path} ({type(err).__name__}: {err})")
                continue
            for row in rows:
                if "epoch" in row and any(k.startswith(self.prefix) for k in row):
                    have_epochs.add(int(row["epoch"]))
                if "episode/episode" in row:
                    have_episodes.add(int(row["episode/episode"]))
        self._note_wandb_file(logger)
        missing = [row for row in self._history if int(row["epoch"]) not in have_epochs]
        missing_episodes = [e for e in self._episodes if int(e["episode"]) not in have_episodes]
        if unreadable:
            warnings.warn(f"AsyncMetricsCallback: cannot read the earlier W&B run {'; '.join(unreadable)}: of epochs "
                          f"{_spans(epochs)}, those it lacks are not re-logged to {current} and may be missing "
                          f"from W&B", stacklevel=2)
            return
        if not missing and not missing_episodes:
            return
        names = [k for row in missing for k in row if k not in _INFO_KEYS]
        self._define_wandb_steps(logger, names, bool(self._episodes))
        self._log_rows(logger, missing_episodes, missing)
        rank_zero_info(f"AsyncMetricsCallback: re-logged to {current} what the earlier W&B run(s) lack: "
                       f"{len(missing)} epoch(s) {_spans([int(r['epoch']) for r in missing])}, "
                       f"{len(missing_episodes)} episode(s)")

    def _read_episodes(self, item: HostCopy) -> list[dict[str, float]]:
        """Rows of the episodes that ended since the previous snapshot (appended to :attr:`episodes`)."""
        if item.episodes is None:
            return []
        log, count = item.episodes
        total = int(count)  # sync-ok: host copy, its event has completed
        if total < self._episodes_seen:  # a log that restarted (a new module): read it from the start
            self._episodes_seen = 0
        rows, dropped = episode_log_rows(log, total, self._episodes_seen)
        if dropped:
            self.episodes_dropped += dropped
            warnings.warn(f"AsyncMetricsCallback: {dropped} episode(s) ended and were overwritten in the module's "
                          f"episode log ({log.shape[0]} rows) between two snapshots; give it more rows",
                          stacklevel=2)
        t0 = self._t0 if self._t0 is not None else 0.0
        first = len(self._episodes) + self.episodes_dropped  # the run's episode index (continues on resume)
        returns = [e["return"] for e in self._episodes[-(self.return_window - 1):]] if self.return_window > 1 else []
        new = []
        for k, (env_steps, t, ret) in enumerate(rows):
            returns.append(ret)
            window = returns[-self.return_window:]
            new.append({"episode": first + k, "env_steps": env_steps, "time_s": t - t0, "return": ret,
                        "return_mean": sum(window) / len(window)})
        self._episodes.extend(new)
        self._episodes_seen = total
        return new

    def _define_wandb_steps(self, logger: WandbLogger, names: list[str], episodes: bool) -> None:
        """Plot ``episode/*`` against ``episode/env_steps`` (module with an episode log) and ``<prefix>*`` against
        ``<prefix>env_steps`` (module logging ``env_steps``) in W&B, once per run, before its first row."""
        if not episodes and "env_steps" not in names:
            return
        run = logger.experiment
        if id(run) in self._wandb_defined or not callable(getattr(run, "define_metric", None)):
            return
        self._wandb_defined.add(id(run))
        if episodes:
            run.define_metric("episode/env_steps")
            run.define_metric("episode/*", step_metric="episode/env_steps")
        if "env_steps" in names:
            run.define_metric(f"{self.prefix}env_steps")
            run.define_metric(f"{self.prefix}*", step_metric=f"{self.prefix}env_steps")


def _spans(values: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (``"none"`` when empty)."""
    spans: list[list[int]] = []
    for v in sorted(set(values)):
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) or "none"
