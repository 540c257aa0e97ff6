"""``lightning-per fit``: the DQN's command line (LightningCLI); :mod:`lightning_per.console` dispatches to it.

Usage::

    lightning-per fit --config configs/dqn_cartpole.yaml            # train the DQN
    lightning-per fit --config configs/dqn_cartpole.yaml --ckpt_path runs/dqn_cartpole/checkpoints/last.ckpt
    lightning-per fit --print_config                                  # every knob with its default
    lightning-per ga3c --config configs/ga3c_cartpole.yaml            # GA3C (GA3CCLI, same layout)

Defaults added to every ``fit`` (each replaceable in YAML under ``trainer:``): a W&B logger that runs
offline without credentials (:class:`~lightning_per.callbacks.AutoModeWandbLogger`), the
:class:`~lightning_per.callbacks.AsyncMetricsCallback` (epoch-level metrics without per-step syncs),
the :class:`~lightning_per.callbacks.RunArtifactsCallback` (``summary.json``, learning-curve PNG, final
line), a ``ModelCheckpoint`` saving ``last.ckpt`` every epoch, and atomic checkpoint writes
(:class:`~lightning_per.callbacks.AtomicCheckpointIO`); ``config.yaml`` is written when training starts and
``seed_everything`` recorded in checkpoints (:class:`RunConfigCallback`). A ``save_dir``/``dirpath`` left null in those
means the run directory ``trainer.default_root_dir`` (``<run dir>/checkpoints`` for checkpoints).
``--torch_num_threads`` (default 1) sets torch's intra-op CPU threads; ``--float32_matmul_precision``
(default null: torch's) is ``torch.set_float32_matmul_precision`` (``high``: TF32 tensor cores for float32
matmuls on a GPU that has them).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import os
import pickle
import re
import signal
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from jsonargparse import set_parsing_settings
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from lightning_per.callbacks.async_metrics import AsyncMetricsCallback
from lightning_per.callbacks.checkpoint_io import CHECKPOINT_KIND, AtomicCheckpointIO
from lightning_per.callbacks.wandb_utils import AutoModeWandbLogger, run_metadata
from lightning_per.dqn import DQN
from lightning_per.dqn.state import describe
from lightning_per.envs import check_checkpoint_env_id
from lightning_per.integrity import IntegrityError, verify_file
from lightning_per.lightning_compat import apply_checkpoint_hparams, option_strings, raise_interrupt, subcommand_parser
from lightning_per.utils import NUMPY_MAX_SEED

__all__ = ["LightningPerCLI", "GA3CCLI", "main", "ga3c_main", "ga3c_new_spelling", "TRAINER_DEFAULTS",
           "GA3C_TRAINER_FROM_MODEL", "RESUME_OVERRIDABLE", "LIGHTNING_CHECKPOINT_KEYS", "check_lightning_checkpoint",
           "check_loop_limits", "RunConfigCallback"]

_CB = "lightning_per.callbacks."
TRAINER_DEFAULTS: dict[str, Any] = {
    "default_root_dir": "runs/dqn",
    "max_epochs": 1000,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
    "enable_model_summary": False,
    "logger": {"class_path": _CB + "AutoModeWandbLogger",
               "init_args": {"save_dir": None, "project": "lightning_per", "finish_on_end": True}},
    "callbacks": [
        {"class_path": _CB + "AsyncMetricsCallback",
         "init_args": {"prog_bar": ["loss", "q_mean", "episode_return", "epsilon", "env_steps"]}},
        {"class_path": _CB + "RunArtifactsCallback"},
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
         # one file, overwritten at every epoch end: `last.ckpt` survives a crash or Ctrl-C (with
         # save_top_k=0, Lightning 2.6 writes save_last only at the end of training)
         "init_args": {"dirpath": None, "filename": "last", "save_top_k": 1, "save_last": False,
                       "every_n_epochs": 1, "enable_version_counter": False}},
    ],
    "plugins": [{"class_path": _CB + "AtomicCheckpointIO"}],
}


#: Model options a resumed run may change from the command line (they bound the run; they do not change what
#: the checkpoint holds). Any other ``--model.X`` that differs from the checkpoint is refused.
RESUME_OVERRIDABLE = frozenset({"max_env_steps", "target_return", "sigterm_check_interval"})


def _model_options_given(args: Sequence[str]) -> set[str]:
    """The ``--model.X`` keys (``X`` dotted, e.g. ``replay.sampler``) given on the command line ``args``."""
    return {a[len("--model."):].split("=", 1)[0] for a in map(str, args) if a.startswith("--model.")}


def _expand_given(given: set[str], keys: set[str]) -> set[str]:
    """The flat model keys (``replay.sampler``) that the command line's ``--model.X`` options set: ``X``
    itself, or the keys under it (``--model.replay``). (The parser refuses abbreviations.)"""
    out: set[str] = set()
    for g in given:
        out |= {k for k in keys if k == g or k.startswith(g + ".")}
    return out


def _flat(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """A (nested) model config (jsonargparse Namespace or dict) as ``{"replay.sampler": value, ...}``."""
    if hasattr(cfg, "as_dict"):
        cfg = cfg.as_dict()
    if not isinstance(cfg, dict):
        return {prefix[:-1]: cfg} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) or hasattr(v, "as_dict") else {prefix + k: v})
    return out


def _plain(value: Any) -> Any:
    """Tuples as lists: a checkpoint's ``(256, 256)`` equals a config's ``[256, 256]``."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _class_name(cfg: Any) -> str:
    if isinstance(cfg, dict) or hasattr(cfg, "get"):
        return str(cfg.get("class_path", ""))
    return type(cfg).__name__


def _short_message(message: str) -> str:
    """jsonargparse's message for a bad value inside a nested config (``Parser key "model.replay.sampler":
    Expected ...``) or an optional dataclass (``model.replay: Does not validate
    against any of the Union subtypes ... Parser key "sampler": Expected ... Got value: bogus ...``) as one line
    naming the full option: ``--model.replay.sampler: Expected ... Got value: bogus``; other messages as given."""
    plain = re.fullmatch(r'Parser key "([^"]+)":\s*\n\s*(Expected[^\n]*)\s*', message)
    if plain:  # a bad value of a nested config's field: one line naming the full option
        return f"--{plain[1]}: {plain[2]}"
    if "Union subtypes" not in message:
        return message
    lines = [line.strip() for line in message.splitlines()]
    keys = [m[1] for m in (re.match(r'Parser key "([^"]+)":', line) for line in lines) if m]
    unknown = next((m[1] for m in (re.match(r"Option '([^']+)' is not accepted", line) for line in lines) if m), None)
    if keys and unknown is not None:  # a misspelt field of a nested config: name it and the closest fields
        path = f"--{'.'.join(keys)}"
        known = _config_fields(next((m[1] for m in (re.search(r"class_path '([\w.]+)'", line) for line in lines)
                                     if m), ""))
        close = difflib.get_close_matches(unknown, known, n=3)
        hint = f"; did you mean {', '.join(f'{path}.{c}' for c in close)}?" if close else ""
        return f"{path}.{unknown}: no such option{hint}"
    detail = next((line for line in lines if line.startswith("Expected") and "NoneType" not in line), None)
    if not keys or detail is None:
        return message
    return f"--{'.'.join(keys)}: {detail}"


def _config_fields(class_path: str) -> list[str]:
    """The field names of one of this package's config dataclasses named by ``class_path`` (none for a class
    of another package: nothing else is imported from a message)."""
    module, _, name = class_path.rpartition(".")
    if not module.startswith("lightning_per."):
        return []
    cls = getattr(importlib.import_module(module), name, None)
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []


#: What ``Trainer.fit`` restores from a checkpoint besides the module's own keys (every checkpoint it writes has them).
LIGHTNING_CHECKPOINT_KEYS = ("pytorch-lightning_version", "epoch", "global_step", "state_dict", "loops",
                             "optimizer_states", "lr_schedulers")


def _same_layout(saved: Any, template: Any, key: str) -> None:
    """Refuse ``saved`` where a key of ``template`` (a fresh object's ``state_dict()``) is missing or holds
    another kind of value (int, float, bool, str, dict; None in the template takes anything)."""
    if template is None:
        return
    if isinstance(template, Mapping):
        if not isinstance(saved, Mapping):
            raise ValueError(f"{key} must be a dict, got {describe(saved)}")
        for k, v in template.items():
            if k not in saved:
                raise ValueError(f"{key} has no {k!r}")
            _same_layout(saved[k], v, f"{key}.{k}")
        return
    kind = type(template)
    if kind is float:  # an int where a float was saved is the same number
        ok = isinstance(saved, (int, float)) and not isinstance(saved, bool)
    else:  # exactly: a bool is no int, an int no bool
        ok = type(saved) is kind
    if not ok:
        raise ValueError(f"{key} must be {'an' if kind is int else 'a'} {kind.__name__}, got {describe(saved)}")


def check_lightning_checkpoint(checkpoint: Mapping[str, Any], trainer: Any, model: torch.nn.Module) -> None:
    """Refuse a checkpoint that ``trainer.fit(model, ckpt_path=...)`` would fail to restore part-way (after it
    has written in the run directory): a missing key of :data:`LIGHTNING_CHECKPOINT_KEYS`; a Lightning version
    that is no version string; a negative or non-int ``epoch``/``global_step``; a ``state_dict`` without exactly
    the model's keys, shapes and dtypes; ``loops.fit_loop`` without the layout of ``trainer.fit_loop``'s own
    state; ``optimizer_states`` that the model's optimizer (one, from ``configure_optimizers``) does not load or
    whose tensors do not have their parameters' shapes; ``lr_schedulers`` that is no list; ``callbacks`` whose
    state a callback of this package or of Lightning refuses (tried on a copy of it).

    Raises:
        ValueError: one line naming the key and what was expected.
    """
    from packaging.version import InvalidVersion, Version

    missing = [k for k in LIGHTNING_CHECKPOINT_KEYS if k not in checkpoint]
    if missing:
        what = "none" if len(missing) == len(LIGHTNING_CHECKPOINT_KEYS) else f"no {', '.join(map(repr, missing))}"
        raise ValueError(f"not a Lightning checkpoint of a training run: it has {what} of the keys Trainer.fit "
                         f"restores ({', '.join(LIGHTNING_CHECKPOINT_KEYS)})")
    version = checkpoint["pytorch-lightning_version"]
    try:
        Version(version if isinstance(version, str) else "")
    except InvalidVersion:
        raise ValueError(f"pytorch-lightning_version must be a version string such as '2.6.0', got "
                         f"{describe(version)}") from None
    for key in ("epoch", "global_step"):
        value = checkpoint[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{key} must be an int >= 0, got {describe(value)}")
    saved, live = checkpoint["state_dict"], model.state_dict()
    if not isinstance(saved, Mapping):
        raise ValueError(f"state_dict must be a dict of the model's tensors, got {describe(saved)}")
    unmatched = sorted(set(live) - set(saved)) + sorted(set(saved) - set(live))
    if model.strict_loading and unmatched:  # Lightning's strict load refuses them
        name = unmatched[0]
        raise ValueError(f"state_dict {'has no' if name in live else 'has an entry'} {name!r} "
                         f"({'the model has it' if name in live else 'the model has none of that name'})")
    for name, tensor in live.items():
        value = saved.get(name, tensor)
        if not isinstance(value, torch.Tensor) or value.shape != tensor.shape or value.dtype != tensor.dtype:
            raise ValueError(f"state_dict[{name!r}] must be {describe(tensor)}, got {describe(value)}")
    loops = checkpoint["loops"]
    _same_layout(loops.get("fit_loop") if isinstance(loops, Mapping) else loops, trainer.fit_loop.state_dict(),
                 "loops.fit_loop")
    states = checkpoint["optimizer_states"]
    optimizer = model.configure_optimizers()
    if isinstance(optimizer, torch.optim.Optimizer):
        if not isinstance(states, (list, tuple)) or len(states) != 1:
            raise ValueError(f"optimizer_states must be a list of one optimizer state ({type(optimizer).__name__}),"
                             f" got {describe(states)}")
        try:
            optimizer.load_state_dict(copy.deepcopy(states[0]))
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RuntimeError) as err:
            raise ValueError(f"optimizer_states[0] is not a state of this model's {type(optimizer).__name__} "
                             f"({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})") from None
        for i, param in enumerate(p for group in optimizer.param_groups for p in group["params"]):
            for key, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                    raise ValueError(f"optimizer_states[0] parameter {i} {key} must have shape {tuple(param.shape)}, "
                                     f"got {describe(value)}")
    if not isinstance(checkpoint["lr_schedulers"], (list, tuple)):
        raise ValueError(f"lr_schedulers must be a list, got {describe(checkpoint['lr_schedulers'])}")
    states = checkpoint.get("callbacks")
    if states is None:
        return
    if not isinstance(states, Mapping):
        raise ValueError(f"callbacks must be a dict of callback states, got {describe(states)}")
    for callback in trainer.callbacks:
        state = states.get(callback.state_key)
        if not state or not type(callback).__module__.startswith(("lightning_per.", "lightning.pytorch.callbacks.")):
            continue  # a user's callback may act in load_state_dict: not tried twice
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                copy.copy(callback).load_state_dict(copy.deepcopy(state))  # our and Lightning's only assign
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as err:
            raise ValueError(f"callbacks[{callback.state_key!r}] is refused: "
                             f"{str(err).splitlines()[0][:200] if str(err) else type(err).__name__}") from None


def check_loop_limits(checkpoint: Mapping[str, Any], trainer: Any, ckpt: str) -> None:
    """Refuse resuming ``checkpoint`` (read from ``ckpt``, checked by :func:`check_lightning_checkpoint`) under a
    ``trainer`` whose ``max_epochs`` or ``max_steps`` is below what the checkpoint has done. Lightning's rules, read
    before ``Trainer.fit`` writes anything: it raises when the checkpoint's ``epoch`` exceeds ``max_epochs`` (after
    the setup hooks wrote ``config.yaml`` and the logs), and it trains nothing while the epochs the checkpoint has
    finished (``loops.fit_loop.epoch_progress.current.processed``) reach ``max_epochs`` or its ``global_step``
    reaches ``max_steps``. A limit equal to what was done is accepted (a finished run resumed trains nothing);
    -1 is no limit; a ``max_epochs`` of None is Lightning's default (1000 unless ``max_steps`` or a ``Timer`` bounds
    the run).

    Raises:
        ValueError: one line naming the option, the checkpoint's count and the smallest value that trains further.

    Example::

        check_loop_limits(torch.load(path), trainer, path)  # max_epochs=2, 3 epochs done: ValueError
    """
    epochs = checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"]
    steps = checkpoint["global_step"]
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    if max_epochs is None:  # Lightning's _parse_loop_limits, at the start of fit
        max_epochs = 1000 if max_steps == -1 and not any(isinstance(cb, Timer) for cb in trainer.callbacks) else -1
    if max_epochs >= 0 and max_epochs < epochs:
        raise ValueError(f"--trainer.max_epochs={max_epochs} is below the {epochs} epochs the checkpoint {ckpt!r} has "
                         f"finished: give at least {epochs + 1} to train further")
    if max_steps >= 0 and max_steps < steps:
        raise ValueError(f"--trainer.max_steps={max_steps} is below the {steps} steps the checkpoint {ckpt!r} has "
                         f"done: give at least {steps + 1} to train further")


class RunConfigCallback(SaveConfigCallback):
    """Lightning's :class:`~lightning.pytorch.cli.SaveConfigCallback` (``config.yaml`` in the run directory), written
    when training starts instead of at ``setup``, and the run's ``seed_everything`` recorded in every checkpoint.

    ``Trainer.fit`` restores a checkpoint's loops and optimizer between ``setup`` and the start of training, so a
    resume that Lightning refuses while restoring leaves an earlier run's ``config.yaml`` as it was; a fit that
    trains nothing (a finished run resumed) does not rewrite it either. The recorded seed lets a resume refuse or
    correct a ``seed_everything`` other than the one the checkpoint's RNG states came from
    (:meth:`LightningPerCLI.before_fit`).

    Raises:
        RuntimeError: as Lightning's, when ``config.yaml`` exists and ``overwrite`` is false.

    Example::

        LightningCLI(DQN, save_config_callback=RunConfigCallback, save_config_kwargs={"overwrite": True})
    """

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Nothing yet: the stage is kept for :meth:`on_train_start`."""
        self.stage = stage

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Write ``config.yaml`` (Lightning's ``setup``; on every rank: it broadcasts)."""
        super().setup(trainer, pl_module, self.stage)

    def state_dict(self) -> dict[str, Any]:
        """``{"seed_everything": <int, or False: not seeded>}``, the run's seed as the LightningCLI applied it."""
        return {"seed_everything": self.config.get("seed_everything")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check a checkpoint's state (:meth:`seed_in`); nothing is restored from it.

        Raises:
            ValueError: ``seed_everything`` is neither an int nor False.
        """
        self.seed_in({"callbacks": {self.state_key: state_dict}})

    def seed_in(self, checkpoint: Mapping[str, Any]) -> int | bool | None:
        """The ``seed_everything`` that this callback's state in ``checkpoint`` (a loaded Lightning checkpoint)
        records; None when the checkpoint holds no state of this callback (written before it was recorded).

        Raises:
            ValueError: the recorded seed is neither an int nor False.

        Example::

            seed = run_config_callback.seed_in(torch.load(path, weights_only=True))
        """
        states = checkpoint.get("callbacks")
        state = states.get(self.state_key) if isinstance(states, Mapping) else None
        if state is None:
            return None
        if not isinstance(state, Mapping):
            raise ValueError(f"must be a dict, got {describe(state)}")
        seed = state.get("seed_everything")
        if seed is not False and type(seed) is not int:
            raise ValueError(f"seed_everything must be an int or false, got {describe(seed)}")
        return seed


def _run_directories(trainer: Any) -> list[tuple[str, str]]:
    """``(option, directory)`` of every local directory a ``fit`` with the ``trainer`` config writes in (the run
    directory, a logger's ``save_dir``, a callback's ``dirpath``), each directory once, named by its first option."""
    found = [("--trainer.default_root_dir", trainer.get("default_root_dir") or os.getcwd())]
    loggers = trainer.get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        args = logger.get("init_args") if hasattr(logger, "get") else None
        if args is not None and args.get("save_dir"):
            found.append((f"--trainer.logger ({_class_name(logger).rpartition('.')[2]}) save_dir", args["save_dir"]))
    for cb in trainer.get("callbacks") or []:
        args = cb.get("init_args") if hasattr(cb, "get") else None
        if args is not None and args.get("dirpath"):
            found.append((f"--trainer.callbacks ({_class_name(cb).rpartition('.')[2]}) dirpath", args["dirpath"]))
    seen: set[str] = set()
    out = []
    for option, path in found:
        path = os.fspath(path)
        if "://" not in path and os.path.abspath(path) not in seen:
            seen.add(os.path.abspath(path))
            out.append((option, path))
    return out


def _unwritable(path: str) -> str | None:
    """Why the directory ``path`` cannot be created or written (None: it can), without creating anything."""
    target = Path(path).absolute()
    probe = target
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return (f"{os.fspath(probe)!r} is a file, not a directory" if probe == target else
                f"{os.fspath(probe)!r} is a file, not a directory, so it cannot be created")
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{os.fspath(probe)!r} is not writable by this user" + ("" if probe == target else
                                                                       ", so it cannot be created")
    return None


class _ShortUsageParser(LightningArgumentParser):
    """The console command's parser: a command-line error prints one usage line before its message, not the
    ~80 lines of every Trainer and model option (``--help`` still lists them all), and a bad value inside a
    nested option is named in one line (:func:`_short_message`)."""

    def print_usage(self, file=None) -> None:
        prog = self.prog.replace(" [options]", "")
        (file or sys.stderr).write(f"usage: {prog} [-c CONFIG] [options]\n")

    def error(self, message: str, ex: Exception | None = None):
        return super().error(_suggest_options(_short_message(message), option_strings(self)), ex)


def _suggest_options(message: str, options: Sequence[str]) -> str:
    """argparse's ``unrecognized arguments: --model.gama 0.9`` with the closest options of the parser after each
    unknown one (``--model.gama (did you mean --model.gamma?)``); other messages as given."""
    head = "unrecognized arguments: "
    if not message.startswith(head):
        return message
    words = []
    for word in message[len(head):].split(" "):
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], options, n=2, cutoff=0.75)
            if close:
                word += f" (did you mean {' or '.join(close)}?)"
        words.append(word)
    return head + " ".join(words)


class LightningPerCLI(LightningCLI):
    """LightningCLI for :class:`~lightning_per.dqn.DQN` that fills run-directory paths left null."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.set_defaults({f"trainer.{k}": v for k, v in TRAINER_DEFAULTS.items()})
        parser.add_argument("--torch_num_threads", type=int | None, default=1,
                            help="torch.set_num_threads for this process (intra-op CPU threads; small "
                                 "networks run fastest with 1, and env stepping shares the cores). "
                                 "null leaves torch's default.")
        parser.add_argument("--float32_matmul_precision", type=Literal["highest", "high", "medium"] | None,
                            default=None,
                            help="torch.set_float32_matmul_precision for this process: 'high' runs float32 "
                                 "matmuls on TF32 tensor cores (docs/dqn.md, 'Pong'); null leaves torch's "
                                 "default ('highest').")

    def parse_arguments(self, parser, args) -> None:
        """Lightning's parse, then ``--seed_everything`` checked before Lightning seeds with it: an int outside
        [0, 2**32 - 1] (what NumPy's seeding accepts) is a one-line error naming it (exit status 2)."""
        super().parse_arguments(parser, args)
        sub = self.config.get("subcommand")
        cfg = self.config.get(sub) if sub else self.config
        seed = cfg.get("seed_everything") if cfg is not None else None
        if not isinstance(seed, bool) and isinstance(seed, int) and not 0 <= seed <= NUMPY_MAX_SEED:
            self._report(ValueError(f"--seed_everything must be an int in [0, {NUMPY_MAX_SEED}] (NumPy's seeds), true "
                                    f"(a random seed) or false (no seeding), got {seed}"))

    def before_instantiate_classes(self) -> None:
        cfg = self.config.get(self.subcommand) if self.subcommand else self.config
        if cfg is None:
            return
        threads = cfg.get("torch_num_threads")
        if threads is not None:
            if threads < 1:
                self._report(ValueError(f"--torch_num_threads must be an integer >= 1 (torch's intra-op CPU "
                                        f"threads), or null for torch's default; got {threads}"))
            torch.set_num_threads(threads)
        precision = cfg.get("float32_matmul_precision")
        if precision is not None:
            torch.set_float32_matmul_precision(precision)
        trainer = cfg["trainer"]
        root = trainer.get("default_root_dir") or os.getcwd()
        loggers = trainer.get("logger")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            if _class_name(logger).endswith("WandbLogger"):
                args = logger.get("init_args")
                if args is not None and args.get("save_dir") in (None, "."):
                    args["save_dir"] = root
        for cb in trainer.get("callbacks") or []:
            if _class_name(cb).endswith("ModelCheckpoint"):
                args = cb.get("init_args")
                if args is not None and args.get("dirpath") is None:
                    args["dirpath"] = os.path.join(root, "checkpoints")


    def __init__(self, *args, friendly_errors: bool = False, **kwargs) -> None:
        self.friendly_errors = friendly_errors
        raw = kwargs.get("args")
        self._given = _model_options_given(sys.argv[1:] if raw is None else raw)
        self._seed_given = any(str(a).split("=", 1)[0] == "--seed_everything"
                               for a in (sys.argv[1:] if raw is None else raw))
        super().__init__(*args, **kwargs)

    def _report(self, err: ValueError) -> None:
        """Raise ``err``; with ``friendly_errors`` (the console command) a short command-line error (exit 2)."""
        if not self.friendly_errors or os.environ.get("LIGHTNING_PER_TRACEBACK"):
            raise err
        subcommand = getattr(self, "subcommand", None) or self.config.get("subcommand")  # (unset before instantiation)
        parser = subcommand_parser(self.parser, subcommand)  # the subcommand's own usage and tip
        parser.error(f"{err} (set LIGHTNING_PER_TRACEBACK=1 for the traceback)")

    def _parse_ckpt_path(self) -> None:
        """Lightning's step (``--ckpt_path``: the checkpoint's hyperparameters replace the model settings, so a
        resumed run builds the model it saved; a private hook, listed in
        :data:`lightning_per.lightning_compat.OVERRIDDEN_HOOKS`), made explicit:

        * a ``ckpt_path`` that is a directory or not a checkpoint ``torch.load`` reads is a one-line error;
        * a model option given on the command line (``--model.X``) that differs from the checkpoint's value
          wins when it only bounds the run (:data:`RESUME_OVERRIDABLE`: e.g. ``--model.max_env_steps`` to
          train further) and is an error otherwise (the network, the replay, the env, the schedule must match
          what the checkpoint holds);
        * a setting that differs only through the config file or a default keeps the checkpoint's value,
          with one warning naming each;
        * the checkpoint's ``env.id`` may not name a module to import (Gymnasium's ``module:Id``) unless the
          user's own settings name the same id (:func:`~lightning_per.envs.check_checkpoint_env_id`).
        """
        sub = self.config.get("subcommand")
        cfg = self.config.get(sub) if sub else None
        ckpt = cfg.get("ckpt_path") if cfg is not None else None
        if not ckpt or not os.path.exists(str(ckpt)):  # a missing path: _preflight's error
            return apply_checkpoint_hparams(self)
        if os.path.isdir(ckpt):
            inside = "last.ckpt" if os.path.basename(os.path.normpath(ckpt)) == "checkpoints" else \
                os.path.join("checkpoints", "last.ckpt")
            self._report(ValueError(f"ckpt_path {ckpt!r} is a directory; give a checkpoint file, e.g. "
                                    f"{os.path.join(ckpt, inside)}"))
        try:  # its manifest first: nothing of a damaged, truncated or unsealed file is read
            verify_file(ckpt, CHECKPOINT_KIND)
        except (IntegrityError, OSError) as err:
            self._report(ValueError(f"ckpt_path {ckpt!r} is not a checkpoint that can be resumed: {err}"))
        before = _flat(cfg.get("model"))
        try:
            apply_checkpoint_hparams(self)
        except pickle.UnpicklingError:  # torch's message suggests turning the safe load off: not repeated
            self._report(ValueError(f"ckpt_path {ckpt!r} is not a checkpoint of plain data (it holds objects other "
                                    f"than tensors, numbers, strings and containers; refused without running them)"))
        except Exception as err:  # noqa: BLE001 - torch.load of a file that is no checkpoint raises anything
            self._report(ValueError(f"ckpt_path {ckpt!r} is not a checkpoint that torch.load can read "
                                    f"({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})"))
        model = self.config[sub]["model"]
        after = _flat(model)
        try:  # before the model is built: an env id read from the checkpoint never imports a module
            check_checkpoint_env_id(after.get("env.id"), before.get("env.id"))
        except ValueError as err:
            self._report(ValueError(f"ckpt_path {ckpt!r}: {err}"))
        changed = {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
                   if _plain(before.get(k)) != _plain(after.get(k))}
        given_keys = _expand_given(self._given, set(before) | set(after))
        given = {k: v for k, v in changed.items() if k in given_keys}
        refused = [k for k in given if k not in RESUME_OVERRIDABLE]
        if refused:
            k = refused[0]
            self._report(ValueError(
                f"--model.{k}={given[k][0]!r}: the checkpoint {ckpt!r} was trained with {given[k][1]!r}, and a "
                f"resumed run keeps the checkpoint's model settings (only {', '.join(sorted(RESUME_OVERRIDABLE))} "
                f"may change); drop the option to resume, or start a new run"))
        for k in given:
            model[k] = given[k][0]  # e.g. a larger max_env_steps: the command line wins
        kept = {k: v for k, v in changed.items() if k not in given}
        if kept:
            warnings.warn("resuming from " + repr(ckpt) + " with the checkpoint's model settings, not the config's: "
                          + ", ".join(f"model.{k}={b!r} (config: {a!r})" for k, (a, b) in kept.items()),
                          UserWarning, stacklevel=2)

    def fit(self, model, **kwargs: Any) -> None:
        """The ``fit`` subcommand (LightningCLI runs a method of the CLI named after the subcommand in place of the
        Trainer's): ``trainer.fit``, with a ``ValueError``/``TypeError`` raised before training started (``setup``:
        e.g. a replay capacity no memory holds) reported as a one-line error (exit status 2) with
        ``friendly_errors``, and Lightning's ``sys.exit(1)`` after Ctrl-C raised again as the KeyboardInterrupt it
        was (its hooks have run: ``summary.json`` says ``interrupted``)."""
        try:
            self.trainer.fit(model, **kwargs)
        except SystemExit as stop:  # after Ctrl-C: the KeyboardInterrupt it was (main's exit status 130)
            raise_interrupt(stop, self.trainer)
        except (ValueError, TypeError) as err:
            if not self.friendly_errors or getattr(getattr(self, "model", None), "fit_started", True):
                raise
            self._report(err if isinstance(err, ValueError) else ValueError(f"{type(err).__name__}: {err}"))

    def before_fit(self) -> None:
        """Everything a resume from ``--ckpt_path`` would refuse, checked before ``Trainer.fit`` writes anything
        in the run directory (config.yaml, summary.json, logs): the checkpoint's manifest and content
        (:meth:`AtomicCheckpointIO.load_checkpoint`), what Lightning restores from it
        (:func:`check_lightning_checkpoint`), ``--trainer.max_epochs``/``max_steps`` against its counters
        (:func:`check_loop_limits`), ``--seed_everything`` against the checkpoint's (:meth:`_keep_checkpoint_seed`),
        then :meth:`DQN.check_resume` (this rank's DDP shard, the dqn_state
        version and the type of each of its values, the replay state). A refusal is a one-line error naming the
        file and the key, exit status 2, with ``friendly_errors``.

        Then the run's settings go to every logger (:meth:`_log_run_config`); a resume first makes the W&B logger
        continue the run the checkpoint names (:meth:`_continue_wandb_run`)."""
        cfg = self.config.get(self.subcommand) if self.subcommand else None
        ckpt = cfg.get("ckpt_path") if cfg is not None else None
        if not ckpt or "://" in str(ckpt) or not os.path.isfile(str(ckpt)):
            self._log_run_config(cfg)
            return
        try:
            checkpoint = AtomicCheckpointIO().load_checkpoint(ckpt, map_location="cpu")
            trainer = self.trainer
            try:
                check_lightning_checkpoint(checkpoint, trainer, self.model)
            except ValueError as err:
                raise ValueError(f"{ckpt}: {err}") from None
            check_loop_limits(checkpoint, trainer, ckpt)
            self._keep_checkpoint_seed(checkpoint, ckpt, cfg)
            # the launching process (local rank 0) checks every shard of its node before it starts the others
            first = trainer.node_rank * trainer.num_devices
            node_ranks = range(first, first + trainer.num_devices) if trainer.local_rank == 0 else ()
            device = trainer.strategy.root_device  # the exploration generator's size is known here on the CPU
            rng_bytes = torch.Generator().get_state().numel() if device.type == "cpu" else None
            self.model.check_resume(checkpoint, ckpt, trainer.world_size, trainer.global_rank, node_ranks,
                                    collector_rng_bytes=rng_bytes, env_device=device)
            self._continue_wandb_run(checkpoint, ckpt)
        except (ValueError, TypeError, OSError) as err:
            self._report(err if isinstance(err, ValueError) else ValueError(f"{type(err).__name__}: {err}"))
        self._log_run_config(cfg)

    def _keep_checkpoint_seed(self, checkpoint: Mapping[str, Any], ckpt: str, cfg: Any) -> None:
        """A resumed run's RNG states come from the checkpoint, so its ``seed_everything`` is the one the checkpoint
        records (:meth:`RunConfigCallback.seed_in`): another seed given on the command line is refused; one that
        differs only through the config file or the default is replaced by the checkpoint's (what ``config.yaml``
        and the loggers then record), with one warning. A checkpoint recording no seed changes nothing.

        Raises:
            ValueError: ``--seed_everything`` given and other than the checkpoint's; a recorded seed of another type.
        """
        callbacks = [cb for cb in self.trainer.callbacks if isinstance(cb, RunConfigCallback)]
        try:
            saved = next((s for s in (cb.seed_in(checkpoint) for cb in callbacks) if s is not None), None)
        except ValueError as err:  # (check_lightning_checkpoint has refused it already)
            raise ValueError(f"{ckpt}: callbacks['RunConfigCallback'] is refused: {err}") from None
        given = cfg.get("seed_everything")
        if saved is None or given == saved and type(given) is type(saved):
            return
        if self._seed_given:
            raise ValueError(f"--seed_everything={given!r}: the checkpoint {ckpt!r} was trained with seed_everything="
                             f"{saved!r}, and a resumed run takes its RNG states from the checkpoint; drop the option "
                             f"to resume, or start a new run")
        cfg["seed_everything"] = saved  # the Namespace config.yaml and the loggers read
        warnings.warn(f"resuming from {ckpt!r} with the checkpoint's seed_everything={saved!r} (config: {given!r})",
                      UserWarning, stacklevel=2)

    def _continue_wandb_run(self, checkpoint: Mapping[str, Any], ckpt: str) -> None:
        """Make each :class:`AutoModeWandbLogger` continue the W&B run that the checkpoint's
        :class:`AsyncMetricsCallback` state names (:meth:`AutoModeWandbLogger.continue_run`), so the resumed run's
        history continues the same run. A logger given an id of its own (``init_args.version``/``id``) keeps it,
        with one warning; a checkpoint naming no run (written without W&B or before the id was recorded) starts
        a new one.

        Raises:
            ValueError: the checkpoint's run id is not a W&B run id.
        """
        callbacks = [cb for cb in self.trainer.callbacks if isinstance(cb, AsyncMetricsCallback)]
        run_id = next((r for r in (cb.wandb_run_id_in(checkpoint) for cb in callbacks) if r is not None), None)
        if run_id is None:
            return
        for logger in self.trainer.loggers:
            if not isinstance(logger, AutoModeWandbLogger):
                continue
            if logger.version is None:
                logger.continue_run(run_id)
            elif logger.version != run_id:
                warnings.warn(f"resuming from {ckpt!r}: the W&B logger's own run id {logger.version!r} is kept; the "
                              f"checkpoint's run {run_id!r} is not continued", UserWarning, stacklevel=2)

    def _log_run_config(self, cfg: Any) -> None:
        """Send the run's settings besides the model's (Lightning logs those, ``hparams_initial``) to every logger:
        ``trainer`` (the Trainer's config), ``seed_everything``, ``torch_num_threads``,
        ``float32_matmul_precision``, ``ckpt_path``, the user's ``env_factory`` and ``q_network`` (their
        ``class_path`` and ``init_args``), and :func:`~lightning_per.callbacks.run_metadata`'s
        ``versions`` and ``machine``; the GPU names are read unless a launcher forks processes after this."""
        trainer = self.trainer
        if cfg is None or not trainer.loggers:
            return
        settings = cfg.get("trainer")
        config: dict[str, Any] = {"trainer": settings.as_dict() if hasattr(settings, "as_dict") else settings}
        for key in ("seed_everything", "torch_num_threads", "float32_matmul_precision", "ckpt_path"):
            value = cfg.get(key)
            config[key] = os.fspath(value) if isinstance(value, os.PathLike) else value
        model = cfg.get("model") or {}
        for key in ("env_factory", "q_network"):  # the user's code by class_path (not in the model's hparams)
            value = model.get(key)
            if value is not None:
                config[key] = value.as_dict() if hasattr(value, "as_dict") else str(value)
        launcher = trainer.strategy.launcher
        config.update(run_metadata(query_gpus=launcher is None or not launcher.is_interactive_compatible))
        for logger in trainer.loggers:
            logger.log_hyperparams(config)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """The parser of the command and of each subcommand; short usage lines with ``friendly_errors``."""
        if self.friendly_errors:
            self.parser_class = _ShortUsageParser
        kwargs.setdefault("allow_abbrev", False)  # --trainer.max_epoch is a typo, not max_epochs
        return super().init_parser(**kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Only ``fit``: the DQN module has no validation/test/predict steps (GA3C is ``lightning-per ga3c``)."""
        return {"fit": LightningCLI.subcommands()["fit"]}

    def _preflight(self) -> None:
        """Settings that cannot work on this machine, reported before anything is built or written (a
        failed start must not overwrite an earlier run's files in the run directory)."""
        cfg = self.config.get(self.subcommand) if self.subcommand else self.config
        if cfg is None:
            return
        model, trainer = cfg.get("model") or {}, cfg.get("trainer") or {}
        accelerator = str(trainer.get("accelerator") or "auto")
        cuda = torch.cuda.is_available()
        if accelerator in ("gpu", "cuda") and not cuda:
            raise ValueError(f"trainer.accelerator={accelerator!r} but no CUDA device is visible: run with "
                             f"--trainer.accelerator cpu (and --model.compile false)")
        if model.get("compile") and (accelerator == "cpu" or not cuda):
            raise ValueError("model.compile=true captures the update in a CUDA graph and needs a GPU: set "
                             "--model.compile false on this machine")
        if trainer.get("gradient_clip_val") not in (None, 0, 0.0):
            raise ValueError("trainer.gradient_clip_val: the DQN module optimizes manually (Lightning cannot clip "
                             "for it); use --model.grad_clip_norm")
        if trainer.get("accumulate_grad_batches") not in (None, 1):
            raise ValueError("trainer.accumulate_grad_batches must be 1: the DQN module optimizes manually (one "
                             "optimizer step per update); use a larger --model.replay.batch_size instead")
        for key in ("max_epochs", "max_steps"):  # Lightning reads any negative as "no limit"; -1 is its spelling
            value = trainer.get(key)
            if isinstance(value, int) and value < -1:
                raise ValueError(f"trainer.{key} must be >= 0, or -1 for no limit, got {value}")
        ckpt = cfg.get("ckpt_path")
        if ckpt is not None and ckpt not in ("last", "best", "hpc", "registry") and "://" not in str(ckpt) \
                and not os.path.exists(ckpt):
            raise ValueError(f"ckpt_path {ckpt!r} does not exist")
        for option, path in _run_directories(trainer):
            reason = _unwritable(path)
            if reason is not None:
                raise ValueError(f"{option} {path!r}: the run writes there, but {reason}")

    def instantiate_classes(self) -> None:
        """Build model, trainer, callbacks. With ``friendly_errors`` (the console command), a bad value
        (a ValueError naming the argument) becomes a short command-line error, exit status 2."""
        try:
            self._preflight()
            super().instantiate_classes()
        except ValueError as err:
            self._report(err)
        # Lightning's own checks (--trainer.max_time 5min), a Trainer argument of the wrong kind, an accelerator
        # whose package is missing (tpu), a run directory that is a file: a bad setting, not a bug
        except (MisconfigurationException, TypeError, ImportError, OSError) as err:
            self._report(ValueError(f"{type(err).__name__}: {err}"))


#: Trainer settings a GA3C run derives from its model fields (:func:`lightning_per.ga3c.cli.trainer_settings`,
#: its run directory and W&B logger): given under ``trainer:`` they are refused, naming the field that sets them.
GA3C_TRAINER_FROM_MODEL = {
    "accelerator": "device", "devices": "devices", "num_nodes": "num_nodes", "strategy": "devices",
    "max_steps": "max_updates", "max_time": "max_time_s", "gradient_clip_val": "grad_clip",
    "default_root_dir": "run_dir", "logger": "wandb_mode", "max_epochs": "max_updates",
    "enable_checkpointing": None, "callbacks": None, "num_sanity_val_steps": None, "limit_val_batches": None,
}


def config_kind(path: str | os.PathLike[str]) -> str:
    """``"ga3c"`` for a config whose ``model:`` section holds only fields of
    :class:`~lightning_per.ga3c.config.GA3CConfig`, or the old flat GA3C layout (no sections, every key a field),
    else ``"dqn"`` (a file of other top-level keys, such as ``seed_everything`` alone, too).

    Raises:
        ValueError: the file is not a YAML mapping.
        OSError: it cannot be read.

    Example::

        >>> config_kind("configs/ga3c_cartpole.yaml"), config_kind("configs/dqn_cartpole.yaml")  # doctest: +SKIP
        ('ga3c', 'dqn')
    """
    import yaml

    from lightning_per.ga3c.config import GA3CConfig

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a YAML mapping, got {type(data).__name__}")
    fields = {f.name for f in dataclasses.fields(GA3CConfig)}
    if "model" not in data and "trainer" not in data:
        return "ga3c" if data and set(data) <= fields else "dqn"
    model = data.get("model") or {}
    return "ga3c" if isinstance(model, dict) and model and set(model) <= fields else "dqn"


def wrong_command_for_config(command: str, argv: Sequence[str]) -> str | None:
    """One line when a ``--config`` file of ``argv`` belongs to the other command (a DQN config given to
    ``lightning-per ga3c``, a GA3C config to ``lightning-per fit``), naming the command that takes it; None otherwise
    (a file that cannot be read or parsed is left to the command's own parser, which reports it)."""
    import yaml

    args = [str(a) for a in argv]
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            path = args[i + 1]
        elif arg.startswith("--config="):
            path = arg.partition("=")[2]
        else:
            continue
        try:
            kind = config_kind(path)
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
            continue
        other = {"fit": "ga3c", "ga3c": "dqn"}[command]
        if kind == other:
            right, what = ("lightning-per ga3c", "a GA3C") if kind == "ga3c" else ("lightning-per fit", "a DQN")
            takes = "a DQN config (configs/dqn_*.yaml)" if command == "fit" else "a GA3C config (configs/ga3c_*.yaml)"
            return (f"--config {path} is {what} config: run it with `{right} --config {path}`; "
                    f"lightning-per {command} takes {takes}")
    return None


def ga3c_new_spelling(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``lightning-per ga3c``'s command line in the LightningCLI layout, and what was spelt the old way.

    An option named like a :class:`~lightning_per.ga3c.config.GA3CConfig` field (``--agents 4``, the flat flags of
    the last release) becomes ``--model.agents 4``; a ``--config`` file whose top level holds fields (the old flat
    layout: no ``model:`` or ``trainer:`` section) is read with its text under ``model:``. Returns the new command
    line and one note per old spelling (``--agents -> --model.agents``); everything else is kept as given.
    """
    from lightning_per.ga3c.config import GA3CConfig

    fields = {f.name for f in dataclasses.fields(GA3CConfig)}
    out: list[str] = []
    notes: list[str] = []
    args = [str(a) for a in argv]
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name in fields:
            out.append(f"--model.{name}{eq}{value}")
            notes.append(f"--{name} -> --model.{name}")
        elif name == "config" and (eq or i + 1 < len(args)):
            path = value if eq else args[i + 1]
            i += 0 if eq else 1
            flat = _flat_ga3c_file(path, fields)
            out += ["--config", path if flat is None else flat]
            if flat is not None:
                notes.append(f"{path}: its keys under 'model:'")
        else:
            out.append(arg)
        i += 1
    return out, notes


def _flat_ga3c_file(path: str, fields: set[str]) -> str | None:
    """The text of the YAML file ``path`` under ``model:`` when it is in the old flat layout (a mapping whose keys
    include a GA3C field and no ``model``/``trainer``); None for anything else (the parser reports it)."""
    import yaml

    try:
        text = Path(path).read_text()
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(data, dict) or {"model", "trainer"} & set(data) or not fields & set(data):
        return None
    return "model:\n" + "".join(f"  {line}" if line.strip() else line for line in text.splitlines(keepends=True))


class GA3CCLI(LightningCLI):
    """``lightning-per ga3c``: GA3C's LightningCLI, in ``lightning-per fit``'s layout.

    ``--model.<field>`` is a field of :class:`~lightning_per.ga3c.config.GA3CConfig` (the dataclass is the source:
    a new field is a new option, documented by its docstring), ``--trainer.<arg>`` a Trainer argument, and a config
    file holds ``model:`` and ``trainer:`` sections; one-line errors, abbreviations refused (``--model.agent``) and
    the closest option suggested, as in ``fit``. Trainer settings that GA3C derives from model fields
    (:data:`GA3C_TRAINER_FROM_MODEL`) are refused under ``trainer:``; the others (e.g. ``precision``,
    ``log_every_n_steps``) go to the run's Trainer. ``seed_everything`` is ``false``: a GA3C run seeds from
    ``--model.seed`` (its agents' environments too). Nothing runs here: :attr:`ga3c_config` (validated),
    :attr:`model` (the :class:`~lightning_per.ga3c.GA3C` module, its environment probed) and
    :attr:`trainer_extra` are for :func:`lightning_per.ga3c.cli.run`.

    Raises:
        SystemExit: a command-line error (status 2: a usage line and the error, with ``friendly_errors``), ``--help``.
        ValueError: a bad value (``model.t_max must be ...``), an environment that cannot be made, a Trainer setting
            GA3C derives from a model field.
    """

    def __init__(self, args: Sequence[str] | None = None, friendly_errors: bool = False) -> None:
        from lightning_per.ga3c.module import GA3C

        self.friendly_errors = friendly_errors
        self.ga3c_config: Any = None
        self.trainer_extra: dict[str, Any] = {}
        super().__init__(GA3C, seed_everything_default=False, save_config_callback=None, run=False,
                         auto_configure_optimizers=False, args=None if args is None else list(args),
                         parser_kwargs={"prog": "lightning-per ga3c", "description": _GA3C_DESCRIPTION})

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """The parser; short usage lines with ``friendly_errors``; abbreviations refused."""
        if self.friendly_errors:
            self.parser_class = _ShortUsageParser
        kwargs.setdefault("allow_abbrev", False)
        return super().init_parser(**kwargs)

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """``--trainer.*`` (the Trainer's arguments) and ``--model.*`` (:class:`GA3CConfig`'s fields)."""
        from lightning_per.ga3c.config import GA3CConfig

        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.add_class_arguments(GA3CConfig, "model", sub_configs=True)

    def instantiate_classes(self) -> None:
        """Validate the model fields into :attr:`ga3c_config`, check the Trainer settings into
        :attr:`trainer_extra`, and build the module (:func:`lightning_per.ga3c.cli.prepare`: the device, the
        environment): every setting error before a run directory is written."""
        from lightning_per.ga3c.cli import prepare
        from lightning_per.ga3c.config import GA3CConfig

        seed = self.config.get("seed_everything")
        if seed is not False:
            raise ValueError(f"--seed_everything={seed!r}: a GA3C run seeds every process from --model.seed; set "
                             f"that instead")
        defaults = self.parser.get_defaults().get("trainer").as_dict()
        for key, value in self.config.get("trainer").as_dict().items():
            if _plain(value) == _plain(defaults.get(key)):
                continue
            if key in GA3C_TRAINER_FROM_MODEL:
                field = GA3C_TRAINER_FROM_MODEL[key]
                where = f" from --model.{field}; set that instead" if field else " itself (lightning_per.ga3c.cli.run)"
                raise ValueError(f"--trainer.{key}: a GA3C run sets it{where}")
            if isinstance(value, dict) and "class_path" in value:
                raise ValueError(f"--trainer.{key}: a GA3C run takes plain values here, not a class_path")
            self.trainer_extra[key] = value
        model = self.config.get("model").as_dict()
        try:
            self.ga3c_config = GA3CConfig(**model).validate()
        except ValueError as err:  # the message starts with the field's name
            raise ValueError(f"model.{err}") from None
        self.model = prepare(self.ga3c_config)


_GA3C_DESCRIPTION = ("lightning-per ga3c: GA3C, the hybrid CPU/GPU A3C, through Lightning's Trainer; --model.* are "
                     "GA3CConfig's fields, --trainer.* the Trainer's.")


def ga3c_main(argv: Sequence[str] | None = None) -> int:
    """``lightning-per ga3c ...``: parse with :class:`GA3CCLI` and train (:func:`lightning_per.ga3c.cli.train`:
    SIGTERM stops the run as Ctrl-C does, summary and CSVs written). The old flat spelling (``--agents 4``, a
    flat config file) is accepted for this release with one deprecation line naming the new spelling
    (:func:`ga3c_new_spelling`). Returns the exit status: 0, 2 with one line for a setting error, 130 after Ctrl-C
    and 143 after SIGTERM (the run's files written: ``summary.json`` says ``interrupted``).

    Raises:
        SystemExit: ``--help``, a command-line error (status 2, one usage line and one error line).

    Example::

        ga3c_main(["--config", "configs/ga3c_cartpole.yaml", "--model.max_time_s", "30"])
    """
    from lightning_per.ga3c.cli import RunDirError, train

    given = list(sys.argv[1:] if argv is None else argv)
    wrong = wrong_command_for_config("ga3c", given)
    if wrong is not None:
        return _ga3c_error(ValueError(wrong))
    args, notes = ga3c_new_spelling(given)
    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # --help: each field's docstring
    # the command line, rewritten, is given to the LightningCLI as `args` (sys.argv holds the old spelling)
    warnings.filterwarnings("ignore", message=r"LightningCLI's args parameter is intended")
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")  # Lightning's
    if notes:
        sys.stderr.write(f"lightning-per ga3c: deprecated flat layout, accepted in this release only; new spelling: "
                         f"{'; '.join(notes)}\n")
    try:
        cli = GA3CCLI(args, friendly_errors=True)
    except ValueError as err:  # a setting: nothing was written
        return _ga3c_error(err)
    except KeyboardInterrupt:  # Ctrl-C while the command was being built: nothing started
        return 128 + signal.SIGINT
    try:
        return train(cli.ga3c_config, cli.model, cli.trainer_extra)
    except RunDirError as err:  # before training: nothing was written
        return _ga3c_error(err)


def _ga3c_error(err: ValueError) -> int:
    """A setting error of ``lightning-per ga3c`` on stderr in one line; exit status 2 (``LIGHTNING_PER_TRACEBACK=1``
    raises it)."""
    if os.environ.get("LIGHTNING_PER_TRACEBACK"):
        raise err
    sys.stderr.write(f"lightning-per ga3c: error: {err} (set LIGHTNING_PER_TRACEBACK=1 for the traceback)\n")
    return 2


_DESCRIPTION = ("lightning-per: DQN with GPU-resident prioritized replay through Lightning's Trainer "
                "(lightning-per fit), and GA3C (lightning-per ga3c, the same layout: see lightning-per ga3c --help).")
_EPILOG = ("Examples: lightning-per fit --config configs/dqn_cartpole.yaml | lightning-per fit --help | "
           "lightning-per ga3c --config configs/ga3c_cartpole.yaml | lightning-per ga3c --help")


def _cheap_cuda_check_without_gpu() -> None:
    """Lightning sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` when imported (fork safety). Without a GPU
    torch then asks NVML again on every ``torch.cuda.is_available()``, which ``torch.optim.Adam.step``
    calls each step, a noticeable share of a small update on a CPU. With no GPU visible there is nothing a fork
    could poison, so use the runtime check, whose answer is cached."""
    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1" and not torch.cuda.is_available():
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "0"


def cli_main(args: Sequence[str] | None = None, run: bool = True,
             friendly_errors: bool = False) -> LightningPerCLI:
    """Build (and with ``run=True`` run) the DQN CLI on ``args`` (default ``sys.argv[1:]``).

    ``friendly_errors``: report a bad configuration value as a one-line error and exit with status 2
    (what the console command does) instead of raising the ValueError."""
    _cheap_cuda_check_without_gpu()
    # --help shows each field's docstring of the nested configs (--model.replay.alpha, --model.env.id)
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*the number of training batches.*smaller than the logging.*",
                            category=Warning)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")  # Lightning's
    return LightningPerCLI(DQN, seed_everything_default=0, save_config_callback=RunConfigCallback,
                           save_config_kwargs={"overwrite": True}, args=None if args is None else list(args),
                           run=run, auto_configure_optimizers=False, friendly_errors=friendly_errors,
                           parser_kwargs={"description": _DESCRIPTION, "epilog": _EPILOG})


def main(argv: Sequence[str] | None = None) -> int:
    """``lightning-per fit ...``: the DQN's LightningCLI on ``argv`` (default ``sys.argv[1:]``, read by the
    LightningCLI itself), a bad configuration value reported in one line (exit status 2). A ``fit`` stopped by
    SIGTERM returns 143 (128 + 15, the shell's convention; its ``summary.json`` says ``interrupted``), one
    stopped by Ctrl-C (SIGINT) 130 (128 + 2; ``interrupted`` too). Other commands are
    :func:`lightning_per.console.main`'s.

    Raises:
        SystemExit: the LightningCLI's (``--help``, a command-line error).

    Example::

        main(["fit", "--config", "configs/dqn_cartpole.yaml", "--trainer.max_epochs", "1"])
    """
    wrong = wrong_command_for_config("fit", sys.argv[1:] if argv is None else argv)
    if wrong is not None:
        sys.stderr.write(f"lightning-per fit: error: {wrong}\n")
        return 2
    try:
        cli_main(None if argv is None else list(argv), friendly_errors=True)  # None: LightningCLI reads sys.argv
    except SIGTERMException:  # a SystemExit without a code (status 0): say the run was stopped
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:  # Ctrl-C during the fit (LightningPerCLI.fit), or while it was being built
        return 128 + signal.SIGINT
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
