"""DQN on the device-resident prioritized replay: LightningModule, Q-networks, n-step collection."""

from lightning_per.dqn.collector import NStepCollector, StepOutput
from lightning_per.dqn.compiled import InductorUpdate
from lightning_per.dqn.config import ReplayConfig
from lightning_per.dqn.learner import learner_step, td_loss
from lightning_per.dqn.module import DQN, StepIndices
from lightning_per.dqn.networks import QNetwork, make_q_network
from lightning_per.dqn.targets import (
    dqn_target,
    hard_update,
    linear_schedule,
    n_step_return,
    polyak_update,
    weighted_huber_loss,
)

__all__ = ["DQN", "InductorUpdate", "NStepCollector", "QNetwork", "ReplayConfig", "StepIndices", "StepOutput",
           "dqn_target", "hard_update", "learner_step", "linear_schedule", "make_q_network", "n_step_return",
           "polyak_update", "td_loss", "weighted_huber_loss"]
