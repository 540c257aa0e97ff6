"""The warnings of DQN.on_load_checkpoint when a 2-rank DDP checkpoint is resumed by one process.

Its ``dqn_state`` is rank 0's state without the replay plus ``shards: 2`` (each rank's replay is in
``<ckpt>.rank{r}.replay.pt``): the module says so once, and must not add the checkpoint_replay=False
warning, which is about single-process checkpoints saved without their replay buffer."""

from __future__ import annotations

import types
import warnings

import pytest

from lightning_per.dqn import DQN, ReplayConfig
from lightning_per.envs import EnvConfig

SHARDS_WARNING = ("checkpoint holds 2 DDP replay shards next to it; using rank 0's counters and RNG without a "
                  "replay buffer")
NO_REPLAY_WARNING = "checkpoint has no replay buffer (checkpoint_replay=False): it refills during a new warm-up"


def _dqn(build: bool = True, **kw) -> DQN:
    """A tiny DQN on the torch CartPole (runtime built on the CPU if ``build``), no Trainer."""
    m = DQN(env=EnvConfig(backend="torch", num_envs=4), replay=ReplayConfig(capacity=256, batch_size=16),
            hidden_sizes=(16,), warmup_steps=64, **kw)
    if build:
        m.build_runtime("cpu")
    return m


def _checkpoint(world_size: int, **kw) -> dict:
    """What ``on_save_checkpoint`` writes on rank 0 of a ``world_size``-process fit (a stand-in Trainer
    gives the module its world size: the same code path as under DDP; the shard files themselves are
    written by the strategy and are not needed by a resume with a different number of processes)."""
    m = _dqn(**kw)
    m.on_train_start()  # warm-up: counters and a filled buffer
    m._trainer = types.SimpleNamespace(world_size=world_size, global_rank=0)
    try:
        ckpt: dict = {}
        m.on_save_checkpoint(ckpt)
    finally:
        m._trainer = None
    assert m.env_steps >= 64
    return ckpt


def _checkpoint_warnings(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "checkpoint" in str(w.message)]


@pytest.fixture(scope="module")
def ddp_ckpt() -> dict:
    ckpt = _checkpoint(world_size=2, checkpoint_replay=True)
    state = ckpt["dqn_state"]
    assert state["shards"] == 2 and "replay" not in state and "replay_rng" not in state  # as on disk
    return ckpt


def test_single_process_trainer_resume_warns_once_about_the_shards(ddp_ckpt):
    # Trainer.fit(ckpt_path=...) with devices=1: the runtime exists (setup ran) when the state is restored
    m = _dqn(checkpoint_replay=True)
    m._trainer = types.SimpleNamespace(world_size=1, global_rank=0, ckpt_path="run/last.ckpt")
    try:
        assert _checkpoint_warnings(lambda: m.on_load_checkpoint(ddp_ckpt)) == [SHARDS_WARNING]
    finally:
        m._trainer = None
    state = ddp_ckpt["dqn_state"]
    assert (m.env_steps, m.updates) == (state["env_steps"], state["updates"])  # rank 0's counters
    assert len(m.rb) == 0  # no replay: the warm-up refills it


def test_load_from_checkpoint_path_warns_once_about_the_shards(ddp_ckpt):
    # DQN.load_from_checkpoint: no Trainer, no runtime yet; the state is applied by build_runtime()
    m = _dqn(build=False, checkpoint_replay=True)

    def load():
        m.on_load_checkpoint(ddp_ckpt)
        m.build_runtime("cpu")

    assert _checkpoint_warnings(load) == [SHARDS_WARNING]
    assert m.env_steps == ddp_ckpt["dqn_state"]["env_steps"]


def test_single_process_checkpoint_without_replay_still_says_so():
    ckpt = _checkpoint(world_size=1, checkpoint_replay=False)
    m = _dqn(checkpoint_replay=False)
    assert _checkpoint_warnings(lambda: m.on_load_checkpoint(ckpt)) == [NO_REPLAY_WARNING]


def test_single_process_checkpoint_with_replay_warns_nothing():
    ckpt = _checkpoint(world_size=1, checkpoint_replay=True)
    m = _dqn(checkpoint_replay=True)
    assert _checkpoint_warnings(lambda: m.on_load_checkpoint(ckpt)) == []
    assert len(m.rb) > 0


@pytest.mark.parametrize("world_size", [1, 3])
def test_command_line_resume_of_a_ddp_checkpoint_with_another_process_count_is_refused(ddp_ckpt, world_size):
    # docs/ddp.md: resume with the same number of devices; another number raises naming both. One process
    # too: training on from rank 0's counters would drop every rank's replay and overwrite the run.
    m = _dqn(checkpoint_replay=True)
    with pytest.raises(ValueError, match=rf"written by 2 DDP ranks .*resume it with 2 processes, not {world_size}"):
        m.check_resume(ddp_ckpt, "run/last.ckpt", world_size, 0)
