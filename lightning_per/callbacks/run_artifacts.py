r"""What a finished run leaves behind: ``summary.json``, a learning-curve PNG and one readable line.

Sources (all read at the end of training, where one host sync is fine):

- per-epoch history: the :class:`~lightning_per.callbacks.AsyncMetricsCallback` in ``trainer.callbacks``
  (flushed first, so the last epoch is included);
- ``mean_return``: ``pl_module.episode_returns_ring`` / ``episode_returns_count`` (definition in
  :mod:`lightning_per.metrics.episodes`), mean of the newest ``window`` finished episodes;
- ``env_steps`` / ``updates``: the module attribute of that name (int or 0-d tensor) if it exists, else the
  last epoch's metric of that name; ``updates`` falls back to ``trainer.global_step``.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks.callback import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info

try:  # Lightning >= 2.5 raises it when the process gets SIGTERM (e.g. a cluster's preemption or `timeout`)
    from lightning.pytorch.utilities.exceptions import SIGTERMException
except ImportError:  # pragma: no cover - older Lightning exits without an exception
    SIGTERMException = ()
from typing_extensions import override

from lightning_per.callbacks.async_metrics import AsyncMetricsCallback
from lightning_per.metrics.episodes import recent_mean_return
from lightning_per.schema import check, stamp
from lightning_per.utils import atomic_write, atomic_write_text, json_safe

__all__ = ["RunArtifactsCallback", "format_final_line", "learning_curve_figure", "save_learning_curve",
           "write_episodes_csv", "write_history_csv"]

_SUMMARY_SCHEMA_VERSION = 1  # summary.json's "schema_version" (an output for readers, never loaded back)
_STATE_SCHEMA_VERSION = 1  # the callback's checkpointed state
#: How :func:`lightning_per.schema.check` reads the state: the version was ``"version"`` before, and a state
#: without one is the first layout.
_STATE_SCHEMA = {"legacy_keys": ("version",), "missing": 1, "label": "RunArtifactsCallback state version"}


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{seconds:.1f}s")


def format_final_line(summary: dict[str, Any], path: str | os.PathLike[str]) -> str:
    """``done: 120 epochs, 98,304 env steps, mean return 487.3 (last 20), 2m13s, 1,530 updates/s -> path``."""
    parts = [f"{summary.get('status', 'done')}: {summary['epochs']:,} epochs"]
    if summary.get("env_steps") is not None:
        parts.append(f"{int(summary['env_steps']):,} env steps")
    if summary.get("mean_return") is not None:
        parts.append(f"mean return {summary['mean_return']:.1f} (last {summary['mean_return_episodes']})")
    parts.append(_duration(summary["wall_time_s"]))
    if summary.get("updates_per_s") is not None:
        parts.append(f"{summary['updates_per_s']:,.0f} updates/s")
    return ", ".join(parts) + f" -> {os.fspath(path)}"


def _as_number(value: Any) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().item()  # sync-ok: once, at train end (summary.json)
    if isinstance(value, float) and math.isnan(value):
        return None
    return int(value) if float(value).is_integer() else float(value)


class RunArtifactsCallback(Callback):
    r"""At the end of ``fit``, write ``summary.json`` and ``learning_curve.png`` to the run directory.

    ``summary.json`` keys: ``status`` (``done``; ``interrupted``: Ctrl-C or SIGTERM; ``failed``: any other
    exception), ``mean_return`` (mean of the
    newest ``window`` finished episodes; null before any), ``mean_return_episodes``, ``episodes``,
    ``env_steps``, ``updates``, ``epochs``, ``global_step``, ``wall_time_s`` (seconds of ``fit``, summed
    over resumed segments, ``time.monotonic``), ``updates_per_s``, ``env_steps_per_s``, ``world_size``,
    ``device``, ``device_name``, ``finished_at`` (ISO 8601, UTC), ``metrics`` (the last logged epoch's
    values), ``learning_curve`` (PNG path or null), ``history`` (path of ``history.csv``: one row per logged
    epoch, every metric of the :class:`AsyncMetricsCallback` history; or null), ``episodes_csv`` (path of
    ``episodes.csv``: one row per finished episode, ``episode, env_steps, time_s, return, return_mean``, from
    a module with an episode log; or null). Non-finite numbers are written as null. Files are written
    atomically on global rank 0; one line (:func:`format_final_line`) is logged at INFO.

    Args:
        dirpath: run directory; ``None`` uses ``trainer.default_root_dir``.
        window: number of newest episodes averaged into ``mean_return``.
        plot: write the learning-curve PNG (needs an :class:`AsyncMetricsCallback` history).
        return_key: history metric plotted as the episode return per epoch (modules without an episode log).
        loss_key: history metric of the first panel below the returns (when ``panels`` is None).
        panels: groups of history metrics plotted below the returns, one panel per group (None:
            ``loss_key`` and ``is_weight_mean``); see :func:`learning_curve_figure`.
        episodes_name: file name of the per-episode CSV.
        summary_name: file name of the summary.
        plot_name: file name of the PNG.
        history_name: file name of the per-epoch CSV; None: none written (e.g. a ``CSVLogger`` writes it).
        verbose: log the final line.

    Raises:
        ValueError: ``window < 1``, or a file name that is empty or contains a path separator.

    Example::

        >>> import json
        >>> import tempfile
        >>> from pathlib import Path
        >>> from lightning.pytorch import Trainer
        >>> from lightning.pytorch.demos.boring_classes import BoringModel
        >>> from lightning_per.callbacks import RunArtifactsCallback
        >>> with tempfile.TemporaryDirectory() as run_dir:
        ...     trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, logger=False,
        ...                       enable_checkpointing=False, enable_progress_bar=False,
        ...                       enable_model_summary=False, default_root_dir=run_dir,
        ...                       callbacks=[RunArtifactsCallback(plot=False, verbose=False)])
        ...     trainer.fit(BoringModel())
        ...     summary = json.loads(Path(run_dir, "summary.json").read_text())
        >>> summary["status"], summary["epochs"], summary["updates"], summary["mean_return"]  # no episodes
        ('done', 1, 2, None)
    """

    def __init__(self, dirpath: str | None = None, window: int = 20, plot: bool = True,
                 return_key: str = "episode_return", loss_key: str = "loss",
                 summary_name: str = "summary.json", plot_name: str = "learning_curve.png",
                 verbose: bool = True, history_name: str | None = "history.csv", panels=None,
                 episodes_name: str = "episodes.csv") -> None:
        if int(window) < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        for arg, value in (("summary_name", summary_name), ("plot_name", plot_name),
                           ("history_name", history_name), ("episodes_name", episodes_name)):
            if arg == "history_name" and value is None:
                continue
            if not value or os.sep in value or (os.altsep and os.altsep in value):
                raise ValueError(f"{arg} must be a plain file name, got {value!r}")
        self.dirpath = dirpath
        self.window = int(window)
        self.plot = bool(plot)
        self.return_key, self.loss_key = return_key, loss_key
        self.history_name = history_name
        self.episodes_name = episodes_name
        self.panels = tuple(tuple(g) for g in panels) if panels is not None else ((loss_key,), ("is_weight_mean",))
        self.summary_name, self.plot_name = summary_name, plot_name
        self.verbose = bool(verbose)
        self._elapsed_before_s = 0.0  # wall time of earlier (resumed) segments, seconds
        self._t0: float | None = None
        self.summary: dict[str, Any] | None = None  # the last summary written (None before)
        self.final_line: str | None = None  # the last final line (None before)

    # ---------------------------------------------------------------------------------------- hooks
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t0 = time.monotonic()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.write(trainer, pl_module, status="done", announce=False)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Announced here, after the progress bar has closed, so the line is not overdrawn.
        if self.verbose and self.final_line is not None and trainer.is_global_zero:
            rank_zero_info(self.final_line)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        status = "interrupted" if isinstance(exception, (KeyboardInterrupt, SIGTERMException)) else "failed"
        if self._t0 is None and status == "failed":
            return  # training never started (a bad setting or checkpoint): an earlier run's summary stays as it was
        try:
            self.write(trainer, pl_module, status=status)
        except Exception as err:  # never mask the original exception
            warnings.warn(f"RunArtifactsCallback: could not write the run summary: {err}", stacklevel=2)

    @override
    def state_dict(self) -> dict[str, Any]:
        return stamp({"wall_time_s": self.wall_time_s()}, "RunArtifactsCallback", _STATE_SCHEMA_VERSION)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the training time of the earlier segments).

        Raises:
            ValueError: a newer or unknown schema version (:func:`lightning_per.schema.check`), or a
                ``wall_time_s`` that is not a finite number of seconds >= 0.
        """
        state_dict = check(state_dict, "RunArtifactsCallback", _STATE_SCHEMA_VERSION, **_STATE_SCHEMA)
        wall = state_dict.get("wall_time_s", 0.0)
        if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall) or wall < 0:
            raise ValueError(f"RunArtifactsCallback state: wall_time_s must be a finite number of seconds >= 0, "
                             f"got {wall!r:.60}")
        self._elapsed_before_s = float(wall)

    # ----------------------------------------------------------------------------------- public API
    def wall_time_s(self) -> float:
        """Seconds of training so far, including resumed segments."""
        running = time.monotonic() - self._t0 if self._t0 is not None else 0.0
        return self._elapsed_before_s + running

    def run_dir(self, trainer: pl.Trainer) -> Path:
        """Where the files go: ``dirpath`` or ``trainer.default_root_dir``."""
        return Path(self.dirpath if self.dirpath is not None else trainer.default_root_dir)

    def collect(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                status: str = "done") -> dict[str, Any]:
        """Build the summary dict (every rank; reads device counters once)."""
        metrics_cb = next((c for c in trainer.callbacks if isinstance(c, AsyncMetricsCallback)), None)
        history: list[dict[str, float]] = []
        if metrics_cb is not None:
            metrics_cb.flush(trainer)
            history = metrics_cb.history
        last = history[-1] if history else {}
        ring = getattr(pl_module, "episode_returns_ring", None)
        count = getattr(pl_module, "episode_returns_count", None)
        mean_return, episodes = None, None
        if ring is not None and count is not None:
            episodes = int(count)
            mean_return = recent_mean_return(ring, episodes, self.window)
        elif ring is not None:
            warnings.warn("pl_module has episode_returns_ring but no episode_returns_count; mean_return "
                          "is not computed (see lightning_per.metrics.episodes)", stacklevel=2)

        def counter(name: str) -> float | int | None:
            if hasattr(pl_module, name):
                return _as_number(getattr(pl_module, name))
            return _as_number(last.get(name))

        env_steps = counter("env_steps")
        updates = counter("updates")
        if updates is None:
            updates = trainer.global_step
        wall = self.wall_time_s()
        device = pl_module.device
        return json_safe({
            "schema_version": _SUMMARY_SCHEMA_VERSION,
            "status": status,
            "mean_return": mean_return,
            "mean_return_episodes": min(self.window, episodes) if episodes is not None else None,
            "episodes": episodes,
            "env_steps": env_steps,
            "updates": updates,
            "epochs": trainer.current_epoch,
            "global_step": trainer.global_step,
            "wall_time_s": wall,
            "updates_per_s": updates / wall if updates is not None and wall > 0 else None,
            "env_steps_per_s": env_steps / wall if env_steps is not None and wall > 0 else None,
            "world_size": trainer.world_size,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
            "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "metrics": {k: v for k, v in last.items()},
            "learning_curve": None,
            "history": None,
            "episodes_csv": None,
        })

    def write(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: str = "done",
              announce: bool = True) -> dict[str, Any]:
        """Collect the summary; on global rank 0 write the PNG and ``summary.json`` (and log the final line
        if ``announce`` and ``verbose``). Returns the summary."""
        summary = self.collect(trainer, pl_module, status)
        self.summary = summary
        if not trainer.is_global_zero:
            return summary
        run_dir = self.run_dir(trainer)
        metrics_cb = next((c for c in trainer.callbacks if isinstance(c, AsyncMetricsCallback)), None)
        episodes = metrics_cb.episodes if metrics_cb is not None else []
        if self.plot and metrics_cb is not None and (metrics_cb.history or episodes):
            png = run_dir / self.plot_name
            save_learning_curve(metrics_cb.history, png, self.return_key, self.loss_key, episodes=episodes,
                                panels=self.panels, window=metrics_cb.return_window)
            summary["learning_curve"] = str(png)
        if metrics_cb is not None and metrics_cb.history and self.history_name is not None:
            summary["history"] = str(write_history_csv(metrics_cb.history, run_dir / self.history_name))
        if episodes:
            summary["episodes_csv"] = str(write_episodes_csv(episodes, run_dir / self.episodes_name))
        path = run_dir / self.summary_name
        atomic_write_text(path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
        self.final_line = format_final_line(summary, path)
        if announce and self.verbose:
            rank_zero_info(self.final_line)
        return summary


def write_history_csv(history: list[dict[str, float]], path: str | os.PathLike[str]) -> Path:
    """Write the per-epoch ``history`` (dicts of metric -> value) as CSV atomically: a header with every
    metric seen (``epoch`` first, then in first-seen order), one row per epoch, empty cells where a metric was
    not logged that epoch. Returns the path."""
    path = Path(path)
    columns = list(dict.fromkeys(["epoch", *(k for row in history for k in row)]))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    for row in history:
        writer.writerow({k: _as_number(v) for k, v in row.items()})
    atomic_write_text(path, buf.getvalue())
    return path


def write_episodes_csv(episodes: list[dict[str, float]], path: str | os.PathLike[str]) -> Path:
    """Write the per-episode rows (:attr:`AsyncMetricsCallback.episodes`) as CSV atomically: columns
    ``episode, env_steps, time_s, return, return_mean``, one row per finished episode, oldest first."""
    path = Path(path)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(EPISODE_COLUMNS), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in episodes:
        writer.writerow({k: _as_number(row.get(k)) for k in EPISODE_COLUMNS})
    atomic_write_text(path, buf.getvalue())
    return path


EPISODE_COLUMNS = ("episode", "env_steps", "time_s", "return", "return_mean")
DEFAULT_PANELS = (("loss",), ("is_weight_mean",))


def learning_curve_figure(history: list[dict[str, float]], episodes: list[dict[str, float]] | None = None,
                          return_key: str = "episode_return", panels=DEFAULT_PANELS, window: int = 20):
    """The learning-curve figure (a matplotlib ``Figure`` on the Agg canvas; no pyplot, no display).

    With ``episodes`` (rows ``env_steps``, ``time_s``, ``return``, ``return_mean``, see
    :attr:`~lightning_per.callbacks.AsyncMetricsCallback.episodes`): the first panel plots every episode's
    return (points) and the mean of the last ``window`` (line) against env steps, the second the same
    against wall time (seconds). Without: one panel of ``return_key`` per epoch. Below them, one panel per
    group of ``panels`` (history metrics, e.g. ``("loss",)``, ``("policy_loss", "value_loss")``), the
    groups and keys missing from ``history`` left out, against env steps when every history row has
    ``env_steps``, else against the epoch.

    Returns:
        ``(figure, axes)``: the figure and a dict naming its axes: ``"return_env_steps"``,
        ``"return_time"`` (with episodes) or ``"return_epoch"`` (without), then each panel's keys joined by
        ``"+"``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    by_steps = bool(history) and all(math.isfinite(row.get("env_steps", math.nan)) for row in history)
    x_key, x_label = ("env_steps", "env steps") if by_steps else ("epoch", "epoch")
    groups = [tuple(k for k in group if any(k in row for row in history)) for group in panels]
    groups = [g for g in groups if g]
    names = ["return_env_steps", "return_time"] if episodes else ["return_epoch"]
    if not episodes and not any(return_key in row for row in history):
        names = []
    names += ["+".join(g) for g in groups]
    if not names:  # nothing known to plot: the first metric the history has
        skip = ("epoch", "global_step", "time_s", "epoch_time_s")
        key = next((k for k in (history[0] if history else {}) if k not in skip), "epoch_time_s")
        groups, names = [(key,)], [key]
    fig = Figure(figsize=(7.5, 2.4 * len(names)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = dict(zip(names, fig.subplots(len(names), 1, squeeze=False)[:, 0]))
    if episodes:
        steps = [e["env_steps"] for e in episodes]
        times = [e["time_s"] for e in episodes]
        rets = [e["return"] for e in episodes]
        means = [e["return_mean"] for e in episodes]
        for name, xs, label in (("return_env_steps", steps, "env steps"), ("return_time", times, "wall time (s)")):
            ax = axes[name]
            ax.plot(xs, rets, linestyle="none", marker=".", ms=3, alpha=0.35, label="episode")
            ax.plot(xs, means, label=f"mean of last {window}")
            ax.set_xlabel(label)
            ax.set_ylabel("episode return")
            ax.legend(loc="lower right", fontsize="small")
    elif "return_epoch" in axes:
        ax = axes["return_epoch"]
        rows = [row for row in history if return_key in row]
        ax.plot([row[x_key] for row in rows], [row[return_key] for row in rows], marker="o" if len(rows) < 40 else None,
                ms=3)
        ax.set_xlabel(x_label)
        ax.set_ylabel("episode return (epoch mean)")
    for group in groups:
        ax = axes["+".join(group)]
        finite_all = []
        for key in group:
            rows = [row for row in history if key in row]
            ys = [row[key] for row in rows]
            ax.plot([row[x_key] for row in rows], ys, marker="o" if len(rows) < 40 else None, ms=3, label=key)
            finite_all += [y for y in ys if math.isfinite(y)]
        ax.set_xlabel(x_label)
        ax.set_ylabel(group[0] if len(group) == 1 else " / ".join(group))
        if len(group) > 1:
            ax.legend(fontsize="small")
        if "loss" in group[0] and finite_all and min(finite_all) > 0 and max(finite_all) / min(finite_all) > 100:
            ax.set_yscale("log")
        else:
            ax.ticklabel_format(axis="y", useOffset=False)  # an entropy near ln 2 reads as such, not as an offset
        if x_key == "epoch":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        elif "return_env_steps" in axes:
            ax.sharex(axes["return_env_steps"])  # one env-step range for the returns and the metrics
    for ax in axes.values():
        ax.grid(alpha=0.3)
    return fig, axes


def save_learning_curve(history: list[dict[str, float]], path: str | os.PathLike[str],
                        return_key: str = "episode_return", loss_key: str = "loss",
                        episodes: list[dict[str, float]] | None = None, panels=None, window: int = 20) -> Path:
    """Write :func:`learning_curve_figure` to a PNG atomically (``panels`` None: ``loss_key`` and
    ``is_weight_mean``). Returns the path."""
    panels = ((loss_key,), ("is_weight_mean",)) if panels is None else panels
    fig, _ = learning_curve_figure(history, episodes, return_key, panels, window)
    return atomic_write(path, lambda f: fig.savefig(f, format="png"))
