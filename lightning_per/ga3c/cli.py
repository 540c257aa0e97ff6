"""GA3C's runs: the run directory, the Trainer and the outputs of ``lightning-per ga3c``.

The command itself is :class:`lightning_per.cli.GA3CCLI` (LightningCLI, as ``lightning-per fit``)::

    lightning-per ga3c --config configs/ga3c_cartpole.yaml
    lightning-per ga3c --config configs/ga3c_pong.yaml --model.agents 16 --model.dynamic_adjustment true
    lightning-per ga3c --help                 # every field of GA3CConfig (--model.*) and the Trainer's (--trainer.*)

The run directory ``<run_dir>/<run_name>-<timestamp>/`` receives ``config.yaml`` (the run's ``model:`` and
``trainer:`` sections, a config file for ``--config``),
``summary.json`` (:class:`~lightning_per.callbacks.RunArtifactsCallback`'s keys plus GA3C's
``mean_return``, ``tps``, ``pps``, ``steps_per_s``, ``fps``, ``policy_lag_mean``, ``policy_lag_p50``,
``policy_lag_p95``, ``policy_lag_max``, ``lag_dropped``, ``lag_dropped_frac``, ``wall_time_s``...),
``learning_curve.png`` (episode returns against env steps and wall time; policy and value loss, entropy,
TPS and PPS against env steps), ``episodes.csv`` (one row per finished episode; it and ``summary.json`` agree
however the run stops: :func:`run`), ``history.csv`` (Lightning's ``CSVLogger``:
:class:`~lightning_per.ga3c.history.EpochCSVLogger`) and the W&B files (unless ``wandb_mode`` is
``disabled``; ``auto``, the default, runs offline without W&B credentials, as ``fit``'s logger).

Times (seconds; see "Run length" in :mod:`lightning_per.ga3c.module`). The run's clock starts when
``Trainer.fit`` starts the GA3C system (agents, predictors, trainers), after the imports and the
environment probe; ``max_time_s`` counts on it, and so do the status lines' ``[Time ...]`` and these
``summary.json`` keys: ``stopped_at_s`` (when training was told to stop; ``stop_reason`` says why:
``max_time_s``, ``max_updates``, ``max_env_steps``, ``target_return``, ``system_stopped``, or null for an interruption
or failure) and ``wall_time_s`` (to the end of the shutdown, which took ``shutdown_s``; the rates
divide by it); the ``done: ...`` line prints ``summary.json``'s numbers on this clock (:func:`done_line`).
``train_loop_time_s`` is the other clock: Lightning's training loop only (``on_train_start`` to ``on_train_end``;
``train_loop_updates_per_s`` divides by it, ``updates_per_s`` = ``tps`` by ``wall_time_s``).
Lightning's own "Time limit reached. Elapsed time is ..." (its ``max_time``, whole seconds) also counts from
``on_train_start``.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["train", "run", "prepare", "parse_config", "build_trainer", "trainer_settings", "RunDirError"]

log = logging.getLogger("lightning_per.ga3c")


def _setup_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def prepare(cfg):
    """Seed, check the device and build the :class:`~lightning_per.ga3c.GA3C` module (it probes the
    environment): everything that can fail on a bad setting, before a run directory exists.

    Raises:
        ValueError: ``device: cuda`` without a CUDA device, or an environment that cannot be made (named).
    """
    import gymnasium
    import lightning.pytorch as pl
    import torch

    from lightning_per.ga3c.module import GA3C

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA device is available; use device: auto or cpu")
    pl.seed_everything(cfg.seed, verbose=False)
    try:
        model = GA3C(cfg)
    except gymnasium.error.Error as err:
        raise ValueError(f"env {cfg.env!r} cannot be made: {err}") from err
    except ImportError as err:  # "module:Id": Gymnasium imports the module to register the id
        raise ValueError(f"env {cfg.env!r} cannot be made: its module {cfg.env.partition(':')[0]!r} cannot be "
                         f"imported ({type(err).__name__}: {' '.join(str(err).split('. ')[0].split())})") from err
    if cfg.device == "auto" and not torch.cuda.is_available() and len(model.obs_shape) == 3:
        log.warning("no CUDA device: training the image network of %s on the CPU, a few updates a second (a config "
                    "such as configs/ga3c_pong.yaml is meant for a GPU)", cfg.env)
    return model


def run(cfg, model=None, trainer_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train with :class:`~lightning_per.ga3c.GA3C` under ``Trainer.fit`` and write the run directory.

    Args:
        cfg: the validated config.
        model: the module from :func:`prepare` (built here if None).
        trainer_extra: Trainer arguments besides :func:`trainer_settings`' (``lightning-per ga3c --trainer.*``).

    Returns:
        The summary written to ``summary.json`` (also on interruption or failure; then re-raises). It and
        ``episodes.csv`` (always written, a header only when no episode ended) come from one snapshot of the
        run's counters, taken after the shutdown: ``episodes`` is the CSV's row count, ``last_episode_env_steps``
        its last row's ``env_steps`` and ``mean_return`` its last row's ``return_mean``. Both files are
        replaced atomically.

    Raises:
        RunDirError: the run directory cannot be created or written (a ValueError naming ``run_dir``).
    """
    import torch
    import yaml

    from lightning_per.callbacks import AsyncMetricsCallback, RunArtifactsCallback, make_wandb_logger, run_metadata
    from lightning_per.callbacks.run_artifacts import write_episodes_csv
    from lightning_per.ga3c.history import EpochCSVLogger
    from lightning_per.lightning_compat import raise_interrupt
    from lightning_per.utils import atomic_write_text, json_safe

    _setup_logging()
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    model = prepare(cfg) if model is None else model
    # Under DDP Lightning's launcher re-runs this command for ranks >= 1 with this process's environment:
    # they find rank 0's run directory there and write nothing but their own logs. Across nodes (num_nodes > 1)
    # every process is started by the cluster's launcher: give them one run directory through
    # LIGHTNING_PER_GA3C_RUN_DIR; only global rank 0 (node 0, local rank 0) writes the run's files.
    inherited = os.environ.get(_RUN_DIR_ENV)
    is_rank_zero = os.environ.get("NODE_RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"
    if inherited is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = Path(cfg.run_dir) / f"{cfg.run_name}-{stamp}"
        if cfg.devices > 1:
            os.environ[_RUN_DIR_ENV] = str(run_dir)
    else:
        run_dir = Path(inherited)
    # DDP: rates and counts add up over the ranks; everything else is averaged (AsyncMetricsCallback)
    rank_ops = {name: "sum" for name in ("pps", "steps_per_s", "fps", "na", "np", "nt", "env_steps", "episodes")}
    metrics = AsyncMetricsCallback(prog_bar=False, rank_ops=rank_ops, return_window=cfg.return_window)
    history = EpochCSVLogger(run_dir, metrics)  # history.csv, one row per epoch
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if is_rank_zero:
            history.open()  # while run_dir is empty
            layout = {"model": cfg.to_dict(), **({"trainer": dict(trainer_extra)} if trainer_extra else {})}
            atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(layout, sort_keys=False))
    except (OSError, ValueError) as err:  # ValueError: atomic_write_text's "is a directory"
        if inherited is None and cfg.devices > 1:
            os.environ.pop(_RUN_DIR_ENV, None)
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        where = getattr(err, "filename", None)
        if where is not None and str(where) != str(run_dir):
            reason = f"{reason}: {where}"
        raise RunDirError(f"run_dir {cfg.run_dir!r}: cannot write the run directory {str(run_dir)!r} "
                          f"({reason})") from err
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    loggers: list[Any] = []
    if cfg.wandb_mode != "disabled":
        wandb = make_wandb_logger(run_dir, project=cfg.wandb_project, name=run_dir.name,
                                  mode=None if cfg.wandb_mode == "auto" else cfg.wandb_mode, finish_on_end=True)
        # as fit's: every model field, the Trainer's settings (`trainer.*`), the seed, the versions and the machine
        wandb.log_hyperparams({**cfg.to_dict(), "trainer": {**trainer_settings(cfg, cuda), **(trainer_extra or {}),
                                                            "default_root_dir": str(run_dir)},
                               "seed_everything": cfg.seed, **run_metadata()})
        loggers.append(wandb)
    # verbose=False: the "done: ..." line is printed below, from the final summary.json (the callback's would come
    # before the shutdown, with the numbers of that moment)
    artifacts = RunArtifactsCallback(dirpath=str(run_dir), window=cfg.return_window, history_name=None, verbose=False,
                                     panels=[("policy_loss", "value_loss"), ("entropy", "dead_unit_frac"), ("tps",),
                                             ("pps",)])
    trainer = build_trainer(cfg, cuda, [*loggers, history], [metrics, artifacts], run_dir, trainer_extra)
    log.info("GA3C run %s: %s, obs %s %s, %d actions, device %s", run_dir, cfg.env, model.obs_shape,
             model.obs_dtype, model.n_actions, "cuda" if cuda else "cpu")
    summary: dict[str, Any] = {}
    try:
        try:
            trainer.fit(model)
        except SystemExit as stop:  # after Ctrl-C or SIGTERM: the KeyboardInterrupt it was (train's 130 or 143)
            raise_interrupt(stop, trainer)
        if artifacts.summary is None:
            # Lightning fetches the first batch before on_train_start; when the run stopped before any batch
            # came (max_time_s while the agents were still starting), it skips its training loop and with
            # it the hooks that write the run files: write them here (training loop time 0)
            artifacts.write(trainer, model, status="done")
    finally:
        try:
            model.shutdown()
        finally:
            # one snapshot of the stats, after the shutdown (no episode ends any more), gives both files: the
            # callback's (written at the train end or the exception, before the shutdown) are replaced
            rows = model.episode_rows
            csv_path = run_dir / "episodes.csv"
            summary = {**(artifacts.summary or {}), "episodes": len(rows), "last_episode_env_steps": None,
                       **model.system_summary, "run_dir": str(run_dir), "episodes_csv": str(csv_path),
                       "history": str(history.path) if history.path.is_file() else None}
            if artifacts.summary is not None:  # its wall_time_s and updates_per_s are replaced by GA3C's clock's
                summary["train_loop_time_s"] = artifacts.summary.get("wall_time_s")
                summary["train_loop_updates_per_s"] = artifacts.summary.get("updates_per_s")
            summary["updates_per_s"] = summary.get("tps")  # updates / wall_time_s, as every rate of the file
            if inherited is None:
                os.environ.pop(_RUN_DIR_ENV, None)  # a later run in this process starts its own directory
            if is_rank_zero:
                write_episodes_csv(rows, csv_path)  # first: the summary names it
                atomic_write_text(run_dir / "summary.json", json.dumps(json_safe(summary), indent=2) + "\n")
                if artifacts.summary is not None:  # the training loop ran: the "done: ..." line of summary.json
                    log.info("%s", done_line(summary, run_dir / "summary.json"))
            log.info("summary: mean_return %s (last %s of %s episodes), %.1f TPS, %.1f PPS, %.1f steps/s, lag %s "
                     "(p95 %s, dropped %s); since the GA3C system started: stopped after %s s (%s), wall %s s with "
                     "the %s s shutdown; Lightning's training loop: %s s -> %s", _fmt(summary.get("mean_return")),
                     summary.get("mean_return_episodes"), summary.get("episodes"), summary.get("tps") or 0.0,
                     summary.get("pps") or 0.0,
                     summary.get("steps_per_s") or 0.0, _fmt(summary.get("policy_lag_mean")),
                     _fmt(summary.get("policy_lag_p95"), 0), _fmt(summary.get("lag_dropped_frac"), 3),
                     _fmt(summary.get("stopped_at_s"), 1), summary.get("stop_reason") or summary.get("status") or "n/a",
                     _fmt(summary.get("wall_time_s"), 1), _fmt(summary.get("shutdown_s")),
                     _fmt(summary.get("train_loop_time_s"), 1), run_dir / "summary.json")
    return summary


def done_line(summary: dict[str, Any], path: str | os.PathLike[str]) -> str:
    """The ``done: ...`` line of a GA3C run's final ``summary``: its status, epochs, env steps, mean return (of
    ``mean_return_episodes``), ``wall_time_s`` and ``updates_per_s`` (``tps``), the numbers ``summary.json`` holds
    (:func:`~lightning_per.callbacks.run_artifacts.format_final_line`'s layout)."""
    from lightning_per.callbacks.run_artifacts import format_final_line

    return format_final_line(summary, path)


_RUN_DIR_ENV = "LIGHTNING_PER_GA3C_RUN_DIR"


class RunDirError(ValueError):
    """The run directory cannot be created or written (the message names ``run_dir`` and the path)."""


def trainer_settings(cfg, cuda: bool) -> dict[str, Any]:
    """The ``pl.Trainer`` arguments of a GA3C run but its loggers, callbacks and directory: ``cfg.devices`` GPUs
    (or CPU processes) on each of ``cfg.num_nodes`` machines, DDP above one process in all, no epoch bound
    (``max_epochs=-1``), budgets ``max_steps=max_updates`` and ``max_time`` (``max_time_s``, in seconds),
    ``gradient_clip_val=grad_clip``. Plain values: the run's W&B config records them under ``trainer``."""
    return {"accelerator": "gpu" if cuda else "cpu", "devices": cfg.devices, "num_nodes": cfg.num_nodes,
            "strategy": "ddp" if cfg.devices * cfg.num_nodes > 1 else "auto", "max_epochs": -1,
            "max_steps": cfg.max_updates, "max_time": cfg.max_time_s, "gradient_clip_val": cfg.grad_clip,
            "enable_progress_bar": False, "enable_checkpointing": False, "enable_model_summary": False,
            "num_sanity_val_steps": 0, "limit_val_batches": 0, "log_every_n_steps": 1}


def build_trainer(cfg, cuda: bool, logger: Any, callbacks: list, run_dir: str | Path,
                  extra: dict[str, Any] | None = None):
    """The ``pl.Trainer`` a GA3C run fits with (also the ``ga3c-learner`` benchmark suite), on
    :func:`trainer_settings` and the ``extra`` Trainer arguments (``--trainer.*``: none of those settings)."""
    import lightning.pytorch as pl

    settings = {**trainer_settings(cfg, cuda), **(extra or {})}
    settings["max_time"] = datetime.timedelta(seconds=settings["max_time"])
    return pl.Trainer(**settings, logger=logger, callbacks=callbacks, default_root_dir=str(run_dir))


def _fmt(x: Any, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def parse_config(argv: Sequence[str]):
    """The validated :class:`~lightning_per.ga3c.config.GA3CConfig` of ``--config`` / ``--model.<field>`` options
    (:func:`~lightning_per.ga3c.config.config_parser`; the command is :class:`lightning_per.cli.GA3CCLI`).

    Raises:
        ValueError: an unknown option (:class:`~lightning_per.ga3c.config.UnknownOption`), a missing config
            file or a bad value (the message names the field).
    """
    from lightning_per.ga3c.config import config_parser, parse_args

    return parse_args(config_parser(prog="lightning-per ga3c"), list(argv))


def train(cfg, model=None, trainer_extra: dict[str, Any] | None = None) -> int:
    """:func:`run` with SIGTERM handled as an interrupt (Ctrl-C's clean shutdown; main thread only). Returns the
    exit status, as ``lightning-per fit``'s: 0 on success, 130 (128 + SIGINT) after Ctrl-C and 143 (128 + SIGTERM)
    after SIGTERM, the run's files written either way (``summary.json``'s ``status``: ``interrupted``).

    Raises:
        RunDirError: the run directory cannot be written (before training; nothing was written).
    """
    in_main = threading.current_thread() is threading.main_thread()
    received: list[int] = []

    def on_sigterm(signum, frame) -> None:
        received.append(signum)
        raise KeyboardInterrupt  # the same clean shutdown as Ctrl-C

    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    try:
        run(cfg, model, trainer_extra)
    except KeyboardInterrupt:
        return 128 + (signal.SIGTERM if received else signal.SIGINT)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    return 0


