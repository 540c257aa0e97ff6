"""lightning_per's benchmark suites, run through one entry point::

    python -m benchmarks list
    python -m benchmarks run replay|dqn|ga3c|all [--quick] [--device DEV] [--out DIR] [suite options]

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
}
