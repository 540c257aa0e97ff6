"""Every access of lightning_per to private names of Lightning (and of the jsonargparse / argparse parsers its
``LightningCLI`` builds), in one place.

Each function names the private it reads or writes; ``tests/cli/test_lightning_compat.py`` checks that each one still
exists and means what we rely on in the installed Lightning, so an upgrade that renames one fails there, by name.
``tests/project/test_layering.py`` checks that no other module reads a Lightning private or overrides a private
Lightning method other than those in :data:`OVERRIDDEN_HOOKS`. TorchRL's and tensordict's privates are
:mod:`lightning_per.replay.compat`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from lightning.pytorch.cli import LightningCLI

__all__ = ["OVERRIDDEN_HOOKS", "apply_checkpoint_hparams", "ddp_kwargs", "option_strings", "parser_actions",
           "raise_interrupt", "subcommand_parser", "wrap_sigterm_broadcast"]

#: Private Lightning methods that a class of ours overrides (Lightning offers no public hook at that point),
#: by the Lightning class that defines them. ``LightningCLI._parse_ckpt_path``: the step of ``LightningCLI.__init__``
#: between ``parse_arguments`` and ``before_instantiate_classes`` that replaces the model settings with a
#: ``--ckpt_path`` checkpoint's hyperparameters (``lightning_per.cli.LightningPerCLI`` checks around it).
OVERRIDDEN_HOOKS: dict[type, tuple[str, ...]] = {LightningCLI: ("_parse_ckpt_path",)}


def apply_checkpoint_hparams(cli: LightningCLI) -> None:
    """Lightning's own ``LightningCLI._parse_ckpt_path`` on ``cli``: when the subcommand's ``ckpt_path`` is a file,
    load it (``torch.load(weights_only=True)``) and parse its ``hyper_parameters`` into ``cli.config``'s model.

    Raises:
        pickle.UnpicklingError, RuntimeError, OSError: as ``torch.load`` of the file.
    """
    LightningCLI._parse_ckpt_path(cli)


def raise_interrupt(stop: SystemExit, trainer: Any) -> None:
    """Raise again what ended ``trainer.fit`` with ``stop``: Lightning ends a fit stopped by Ctrl-C (or a SIGTERM
    handler that raises ``KeyboardInterrupt``) with ``sys.exit(1)`` after its exception hooks ran; that becomes the
    ``KeyboardInterrupt`` it was (exit status 130 or 143 for the caller to choose), any other exit is ``stop``.

    Raises:
        KeyboardInterrupt: ``stop`` is Lightning's exit after an interrupt (``trainer.interrupted``).
        SystemExit: ``stop`` itself otherwise.

    Example::

        try:
            trainer.fit(model)
        except SystemExit as stop:
            raise_interrupt(stop, trainer)
    """
    if type(stop) is SystemExit and stop.code == 1 and trainer.interrupted:
        raise KeyboardInterrupt from None
    raise stop


def ddp_kwargs(strategy: Any) -> dict[str, Any]:
    """The keyword arguments a ``DDPStrategy`` passes to ``DistributedDataParallel`` (its private ``_ddp_kwargs``;
    the dict itself, so a ``setdefault`` changes what DDP is built with; Lightning has no public setter)."""
    return strategy._ddp_kwargs


def wrap_sigterm_broadcast(loop: Any, wrap: Callable[[Callable[[], None]], Callable[[], None]]) -> bool:
    """Replace, on the instance ``loop`` (Lightning's training epoch loop), its per-step SIGTERM broadcast (the
    private ``_TrainingEpochLoop._broadcast_sigterm_tensor``, Lightning >= 2.6) by ``wrap(original)``, where
    ``original()`` runs Lightning's broadcast. Returns False, changing nothing, when Lightning has no such method
    or ``loop`` was wrapped already (the class and other loops are never changed)."""
    original = getattr(type(loop), "_broadcast_sigterm_tensor", None)
    if original is None or "_broadcast_sigterm_tensor" in vars(loop):
        return False
    loop._broadcast_sigterm_tensor = wrap(functools.partial(original, loop))
    return True


def option_strings(parser: Any) -> list[str]:
    """Every option string an argparse (jsonargparse) parser knows, e.g. ``--model.gamma`` (argparse's private
    ``_option_string_actions``, what it matches abbreviations against)."""
    return list(parser._option_string_actions)


def parser_actions(parser: Any) -> list[Any]:
    """The actions of an argparse (jsonargparse) parser, one per option, each with its ``dest`` and ``help``
    (argparse's private ``_actions``; ``--help`` prints them)."""
    return list(parser._actions)


def subcommand_parser(parser: Any, subcommand: str | None) -> Any:
    """The parser of ``subcommand`` under a jsonargparse ``parser`` with subcommands (its private
    ``_subcommands_action._name_parser_map``), or ``parser`` itself when it has none or no such subcommand."""
    action = getattr(parser, "_subcommands_action", None)
    return getattr(action, "_name_parser_map", {}).get(subcommand, parser)
