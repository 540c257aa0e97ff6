"""DQN on the device-resident prioritized replay: the LightningModule and its replay configuration.

The public API is :class:`DQN` and :class:`ReplayConfig` (the env is configured with
:class:`lightning_per.envs.EnvConfig`). The building blocks stay importable from their modules: the Q-networks
(:mod:`lightning_per.dqn.networks`), n-step collection (:mod:`lightning_per.dqn.collector`), the learner update
(:mod:`lightning_per.dqn.learner`), the targets and losses (:mod:`lightning_per.dqn.targets`), the update strategies
(:mod:`lightning_per.dqn.updates`), Inductor (:mod:`lightning_per.dqn.compiled`) and DDP
(:mod:`lightning_per.dqn.ddp`).
"""

from lightning_per.dqn.config import ReplayConfig
from lightning_per.dqn.module import DQN

__all__ = ["DQN", "ReplayConfig"]
