"""The DQN's update strategies (lightning_per.dqn.updates): which one the settings choose, on the CPU; the removed
``overlap_replay`` is refused."""

from __future__ import annotations

import pytest

from lightning_per.dqn import DQN, ReplayConfig
from lightning_per.dqn.updates import EagerUpdate, LearnerGraphUpdate, ReplayGraphUpdate
from lightning_per.envs import EnvConfig

_KW = {"env": EnvConfig(backend="torch", num_envs=4), "replay": ReplayConfig(capacity=256, batch_size=16),
       "hidden_sizes": (16,), "warmup_steps": 64}


def test_eager_is_chosen_without_compile():
    m = DQN(**_KW)
    m.build_runtime("cpu")
    assert type(m.updater) is EagerUpdate and not m.updater.in_graph
    assert m.learner.inductor is None


def test_compile_without_a_cuda_generator_captures_the_learner_step_only():
    m = DQN(compile=True, **_KW)
    m.build_runtime("cpu")  # the sampler's generator is on the CPU: the whole update cannot be captured
    assert type(m.updater) is LearnerGraphUpdate and not m.updater.in_graph
    assert not ReplayGraphUpdate.captures(m.rb.sampler, "proportional")
    assert m.graph_captures == 0  # nothing is captured before the first update


def test_inductor_builds_the_compiled_pieces_lazily():
    m = DQN(inductor=True, **_KW)
    m.build_runtime("cpu")
    assert m.learner.inductor is not None and m.learner.capture_guard is not None


def test_overlap_replay_is_removed_and_the_default_runs():
    with pytest.raises(TypeError, match="overlap_replay"):
        DQN(overlap_replay=False, **_KW)
    m = DQN(**_KW)
    m.build_runtime("cpu")
    assert type(m.updater) is EagerUpdate
