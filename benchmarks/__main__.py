"""``python -m benchmarks``: list the suites, or run one (or all) and write its canonical results."""

from __future__ import annotations

import argparse
import importlib
import runpy
import sys
import traceback
from pathlib import Path

from benchmarks import SUITES, TOOLS, UsageError


def _module(suite: str):
    return importlib.import_module(SUITES[suite])


def _summary(suite: str) -> str:
    doc = (_module(suite).__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def parser(suite: str | None) -> argparse.ArgumentParser:
    """The ``run`` options common to every suite, plus ``suite``'s own (none for ``all``)."""
    import torch

    ap = argparse.ArgumentParser(prog=f"python -m benchmarks run {suite or 'SUITE'}",
                                 description=_summary(suite) if suite and suite != "all" else None)
    ap.add_argument("--quick", action="store_true", help="small sizes and short runs: a smoke test (any machine)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="benchmarks/results", help="directory of the results (default %(default)s)")
    ap.add_argument("--machine", default=None,
                    help="machine part of the file names (default: the GPU model, e.g. h200, or cpu)")
    if suite and suite != "all" and hasattr(_module(suite), "add_arguments"):
        _module(suite).add_arguments(ap.add_argument_group(f"{suite} options"))
    return ap


def run_suite(suite: str, args: argparse.Namespace) -> list[Path]:
    """Run one suite with ``args``; write and return its results files (none when ``run`` returns None,
    e.g. on a DDP rank other than 0)."""
    from benchmarks._results import environment, write

    args.suite = suite
    results = _module(suite).run(args)
    if results is None:
        return []
    env = environment(args.device)
    env["args"] = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, list, type(None)))}
    paths = write(suite, results, args.out, env, machine=args.machine)
    print(Path(paths[1]).read_text())
    print("wrote", ", ".join(str(p) for p in paths), flush=True)
    return paths


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    choices = [*SUITES, "all"]
    usage = (f"python -m benchmarks list | run {{{','.join(choices)}}} [--quick] [--out DIR] [options]"
             f" | tool {{{','.join(TOOLS)}}} [options]")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if argv[0] == "list":
        for name in SUITES:
            print(f"{name:14s} {_summary(name)}")
        print("tools:", ", ".join(TOOLS))
        return 0
    if argv[0] == "run" and len(argv) >= 2 and argv[1] in ("-h", "--help"):
        print(parser(None).format_help().rstrip())
        print("\nsuites (each adds its own options: python -m benchmarks run SUITE --help):")
        for name in SUITES:
            print(f"  {name:14s} {_summary(name)}")
        print("  all            every suite above, each with its defaults")
        return 0
    if argv[0] == "tool" and len(argv) >= 2 and argv[1] in ("-h", "--help"):
        print(f"usage: python -m benchmarks tool {{{','.join(TOOLS)}}} [options]\n"
              "each tool prints its own options: python -m benchmarks tool TOOL --help")
        return 0
    if argv[0] == "tool":
        if len(argv) < 2 or argv[1] not in TOOLS:
            got = argv[1] if len(argv) > 1 else None
            print(f"usage: {usage}\nerror: expected a tool in {list(TOOLS)}, got {got!r}", file=sys.stderr)
            return 2
        sys.argv = [f"python -m benchmarks tool {argv[1]}", *argv[2:]]
        runpy.run_module(f"benchmarks.{argv[1]}", run_name="__main__", alter_sys=True)
        return 0
    if argv[0] != "run" or len(argv) < 2 or argv[1] not in choices:
        got = argv[1] if argv[0] == "run" and len(argv) > 1 else argv[0]
        print(f"usage: {usage}\nerror: expected a suite in {choices}, got {got!r}", file=sys.stderr)
        return 2
    suite = argv[1]
    args = parser(suite).parse_args(argv[2:])
    if suite != "all":
        try:
            run_suite(suite, args)
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    failed = []
    for name in SUITES:  # every suite with its defaults; one failing suite does not stop the others
        suite_args = parser(name).parse_args([a for a in argv[2:]])
        try:
            run_suite(name, suite_args)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"failed suites: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
