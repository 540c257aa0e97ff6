"""Whole-round batching (``train_max_batch_size``, Sample Factory's synchronous mode): a trainer takes every
rollout ready at its claim, up to the cap, in one batch; GA3C's default takes just what the minimum needs.
Real agent processes on CartPole with a random policy (about 10 s for the file on 2 cores)."""

import time

import pytest
import torch

from lightning_per.actors.envs import probe_env
from lightning_per.ga3c.config import GA3CConfig, load_config
from lightning_per.ga3c.system import GA3CSystem

SPEC = {"env": "CartPole-v1", "backend": "gym", "kwargs": {}, "frame_stack": 4}
T = 5  # steps per rollout, one env per agent: a rollout is 5 transitions


def _random_policy(obs):
    n = obs.shape[0]
    return torch.randint(0, 2, (n,)), torch.zeros(n)


def _system(**kw):
    cfg = GA3CConfig(**{"agents": 4, "max_agents": 4, "envs_per_agent": 1, "t_max": T, "train_min_batch_size": T,
                        "batch_queue_size": 1, "status_interval_s": 0, **kw})
    shape, dtype, _ = probe_env({**SPEC, "num_envs": 1})
    return GA3CSystem(cfg, SPEC, shape, str(dtype), _random_policy, lambda: 0, torch.device("cpu"))


def _third_batch_after_a_full_round(system, ready: int, timeout: float = 30.0) -> dict:
    """Let the trainer block (one batch queued, the next built), wait until ``ready`` rollouts wait unclaimed, then
    take three batches: the third was claimed when at least ``ready`` rollouts were ready."""
    deadline = time.monotonic() + timeout
    while system.queue_sizes()["train_queue"] < ready:  # the agents fill their free slots; a condition, no sleep
        assert time.monotonic() < deadline, f"agents never had {ready} rollouts ready: {system.queue_sizes()}"
        system.stopping.wait(0.05)
    batches = [system.get_batch(timeout=deadline - time.monotonic()) for _ in range(3)]
    assert all(b is not None for b in batches)
    return batches[2]


@pytest.mark.parametrize("cap, expected", [(20, 20), (12, 10), (None, T)])
def test_a_trainer_takes_every_ready_rollout_up_to_the_cap(cap, expected):
    # 4 agents x 2 rollout slots: once 4 rollouts wait, a whole-round claim takes min(4, cap // 5) of them
    # (12 // 5 = 2 whole rollouts); GA3C's default takes the one rollout its minimum of 5 needs
    system = _system(train_max_batch_size=cap).start()
    try:
        batch = _third_batch_after_a_full_round(system, ready=4)
        assert batch["size"] == expected
        assert batch["obs"].shape == (expected, 4) and batch["version"].shape == (expected,)
    finally:
        system.close()


@pytest.mark.parametrize("value", [4, 0, 2.5, True])
def test_a_cap_below_the_minimum_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match=r"^train_max_batch_size must be an int >= train_min_batch_size=5"):
        GA3CConfig(train_min_batch_size=5, train_max_batch_size=value).validate()


def test_whole_round_with_graph_mode_is_refused():
    with pytest.raises(ValueError, match=r"^train_max_batch_size .* cannot be used with cuda_graph: true"):
        GA3CConfig(train_max_batch_size=80, cuda_graph=True).validate()


def test_the_cap_parses_from_yaml_and_defaults_off(tmp_path):
    assert GA3CConfig().train_max_batch_size is None
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  train_min_batch_size: 40\n  train_max_batch_size: 160\n")
    assert load_config(path).train_max_batch_size == 160
