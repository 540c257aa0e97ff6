"""The actor system both learners share: torch-free agent processes, shared-memory rollouts, predictor
threads, spawn / supervision / signals, stats and dynamic adjustment (GA3C, Babaeizadeh et al. 2017,
arXiv:1611.06256; Ape-X, Horgan et al. 2018, arXiv:1803.00933).

Agents -> prediction requests (shared-memory flags + a semaphore) -> predictor threads (batched forward on
the learner's device) -> actions back through shared memory; finished rollouts (flags + a semaphore) -> the
learner's consumers (GA3C's trainer threads, the DQN's replay ingest).

Names are imported lazily (PEP 562): agent processes import the NumPy-only submodules of this package
and must not pay for torch or Lightning.
"""

from __future__ import annotations

from lightning_per.lazy import lazy_exports

__all__ = ["AgentHandle", "Counts", "DynamicAdjuster", "PredictorThread", "SharedRollouts", "Stats",
           "TerminalRewardEnv", "Window", "WorkerThread", "clip_rewards", "make_layout", "nstep_returns"]

_WHERE = {
    "AgentHandle": "spawn", "Counts": "adjust", "DynamicAdjuster": "adjust", "PredictorThread": "predictor",
    "SharedRollouts": "shared", "Stats": "stats", "TerminalRewardEnv": "envs", "Window": "adjust",
    "WorkerThread": "threads", "clip_rewards": "returns", "make_layout": "shared", "nstep_returns": "returns",
}

__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
