"""lightning_per's benchmark suites, run through one entry point::

    python -m benchmarks list
    python -m benchmarks run replay|dqn|ga3c|all [--quick] [--device DEV] [--out DIR] [suite options]
    python -m benchmarks tool profile_step|profile_kernels|... [tool options]

Each suite is a module of this package named in :data:`SUITES`; it exposes ``run(args) -> Results`` and,
optionally, ``add_arguments(parser)`` for its own options (see ``benchmarks/README.md``).
"""

#: Suite name -> module (under this package) with ``run(args) -> benchmarks._results.Results``.
SUITES: dict[str, str] = {
    "replay": "benchmarks.replay",
    "dqn": "benchmarks.dqn",
    "ga3c": "benchmarks.ga3c",
    "ga3c-learner": "benchmarks.ga3c_learner",
    "slice": "benchmarks.slice",
    "user_loop": "benchmarks.user_loop",
    "learning": "benchmarks.learning",
    "writers": "benchmarks.writers",
    "storage": "benchmarks.storage",
    "dropin": "benchmarks.dropin",
}

#: Profiling and analysis tools (modules of this package run as scripts): diagnostics, not published tables.
TOOLS: tuple[str, ...] = ("profile_step", "profile_kernels", "profile_dqn", "host_floor", "replay_host",
                          "replay_eager", "replay_kernels", "tune_warps", "gather", "fit_runs", "profile_loop",
                          "compare", "pool_learning", "first_updates")


class UsageError(ValueError):
    """A suite's options that cannot run (a missing file, a missing option): ``python -m benchmarks`` prints
    it in one line and exits 2."""

