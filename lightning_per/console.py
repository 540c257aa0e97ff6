"""``lightning-per``, the console command: the one place that dispatches its commands.

Answers ``--help`` and unknown commands at once, without importing torch, TorchRL or Lightning (seconds of
imports); ``fit ...`` (and options for the LightningCLI) go to :func:`lightning_per.cli.main`
(the DQN's LightningCLI), ``ga3c ...`` to :func:`lightning_per.cli.ga3c_main` (GA3C's LightningCLI). Run it as
``lightning-per ...`` or ``python -m lightning_per.console ...``.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

__all__ = ["main", "COMMANDS"]

#: The commands and what they do (the top-level help).
COMMANDS = {
    "fit": "train the DQN LightningModule through Lightning's Trainer (every option: lightning-per fit --help)",
    "ga3c": "train GA3C, the hybrid CPU/GPU A3C, through Lightning's Trainer (every option: lightning-per ga3c --help)",
}

_HELP = """usage: lightning-per {{fit,ga3c}} [options]

lightning-per: DQN with GPU-resident prioritized replay, and GA3C, through Lightning's Trainer.

commands:
{commands}

examples:
  lightning-per fit --config configs/dqn_cartpole.yaml
  lightning-per fit --config configs/dqn_cartpole.yaml --trainer.max_epochs 5 --model.replay.sampler rank
  lightning-per ga3c --config configs/ga3c_cartpole.yaml
"""


def help_text() -> str:
    width = max(map(len, COMMANDS))
    return _HELP.format(commands="\n".join(f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightning-per``; returns the exit status.

    ``--help`` (or nothing: status 2) prints the commands; an unknown command is a one-line error naming every
    command (status 2); ``ga3c ...`` goes to :func:`lightning_per.cli.ga3c_main` with the rest; ``fit ...`` and bare
    options go to :func:`lightning_per.cli.main` (a ``fit`` stopped by SIGTERM returns 143, by Ctrl-C 130).

    Raises:
        SystemExit: the LightningCLI's own exits (``--help``, a command-line error).

    Example:
        >>> from lightning_per.console import main
        >>> main(["trian"])  # doctest: +SKIP
        2
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        (sys.stdout if args else sys.stderr).write(help_text())
        return 0 if args else 2
    if not args[0].startswith("-") and args[0] not in COMMANDS:
        sys.stderr.write(f"lightning-per: error: unknown command {args[0]!r} (commands: {', '.join(COMMANDS)}; "
                         f"see lightning-per --help)\n")
        return 2
    try:
        from lightning_per import cli  # torch, TorchRL and Lightning from here on
    except KeyboardInterrupt:  # Ctrl-C while they load: nothing started, nothing written
        return 128 + signal.SIGINT
    if args[0] == "ga3c":
        return cli.ga3c_main(args[1:])
    return cli.main(argv)  # None: the LightningCLI reads sys.argv itself (given both, it warns)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
