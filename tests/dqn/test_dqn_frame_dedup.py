"""DQN with the frame-deduplicated replay (``replay.frame_dedup``): configuration and a real Atari update."""

from __future__ import annotations

import pytest
import torch

from lightning_per import FrameStackStorage
from lightning_per.dqn import DQN, ReplayConfig
from lightning_per.envs import EnvConfig


def test_frame_dedup_needs_the_proportional_sampler_and_frames():
    with pytest.raises(ValueError, match="replay.frame_dedup needs replay.sampler 'proportional'"):
        ReplayConfig(frame_dedup=True, sampler="uniform").validate()
    with pytest.raises(ValueError, match=r"replay.frame_dedup needs stacked frames .* got observation shape \(4,\)"):
        DQN(env=EnvConfig(backend="torch", num_envs=2), replay=ReplayConfig(frame_dedup=True))


def _pong(frame_dedup: bool) -> DQN:
    m = DQN(env=EnvConfig(id="ALE/Pong-v5", backend="ale", num_envs=2, noop_max=0),
            replay=ReplayConfig(capacity=256, batch_size=8, frame_dedup=frame_dedup, packed=True),
            network="nature_cnn", hidden_sizes=(32,), warmup_steps=40, n_step=3)
    m.build_runtime("cpu")
    opt = m.configure_optimizers()
    m.optimizers = lambda: opt
    m.manual_backward = lambda loss: loss.backward()
    m.on_train_start()
    return m


def test_pong_update_with_deduplicated_frames():
    """The same seeded warm-up into the full-stack storage and the deduplicated one stores the same stacks; an
    update trains on them."""
    pytest.importorskip("ale_py")
    m, full = _pong(True), _pong(False)
    storage = m.rb.storage
    assert isinstance(storage, FrameStackStorage) and storage.frame_stack == 4
    n = len(storage)
    assert n == len(full.rb.storage) >= 32
    # each transition adds about one frame (its newest); full stacks hold 8 a transition
    assert int(storage.frames_written) < 2 * n
    got, want = storage.get(torch.arange(n)), full.rb.storage.get(torch.arange(n))
    for key in ("observation", "next_observation", "action", "reward", "discount"):
        assert torch.equal(got[key], want[key]), key
    assert got["observation"].shape == (n, 4, 84, 84) and got["observation"].dtype == torch.uint8
    loss = m.training_step(0, 0)
    assert torch.isfinite(loss)
