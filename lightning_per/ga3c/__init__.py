"""GA3C: hybrid CPU/GPU asynchronous advantage actor-critic (Babaeizadeh et al., ICLR 2017,
arXiv:1611.06256), trained through Lightning.

The agents, predictors, shared rollouts, supervision pieces, stats and dynamic adjustment live in
:mod:`lightning_per.actors` (shared with the DQN's Ape-X acting); this package keeps the trainers, the losses
and the module. Agents (CPU processes) -> prediction requests (shared-memory flags + a semaphore) -> predictor
threads (batched forward on the model device) -> actions back through shared memory; finished
rollouts (flags + a semaphore) -> trainer threads (merge rollouts into batches) ->
``GA3C.training_step`` under ``Trainer.fit``. See ``module.py`` for how
the trainer threads meet Lightning's optimisation loop.

Names are imported lazily (PEP 562): agent processes import the NumPy-only submodules of this
package and must not pay for torch or Lightning.
"""

from __future__ import annotations

from lightning_per.lazy import lazy_exports

__all__ = ["GA3C", "GA3CConfig", "GA3CSystem", "RMSpropTF", "a3c_loss", "appo_loss", "load_config", "make_network"]

_WHERE = {
    "GA3C": "module", "GA3CConfig": "config", "load_config": "config", "GA3CSystem": "system",
    "RMSpropTF": "optim", "a3c_loss": "loss", "appo_loss": "loss", "make_network": "networks",
}

__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
