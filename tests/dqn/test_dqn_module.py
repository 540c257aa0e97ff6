"""DQN LightningModule pieces without a Trainer: networks, validation, one update, replay round trip."""

from __future__ import annotations

import copy
import io
import types

import pytest
import torch

from lightning_per.dqn import DQN, ReplayConfig
from lightning_per.dqn.networks import make_q_network
from lightning_per.envs import EnvConfig


def _module(**kw) -> DQN:
    """A tiny DQN on the torch CartPole, runtime built on the CPU, optimizer wired without a Trainer."""
    kw.setdefault("env", EnvConfig(backend="torch", num_envs=4))
    kw.setdefault("replay", ReplayConfig(capacity=512, batch_size=16))
    kw.setdefault("hidden_sizes", (16,))
    kw.setdefault("warmup_steps", 64)
    m = DQN(**kw)
    m.build_runtime("cpu")
    opt = m.configure_optimizers()
    m.optimizers = lambda: opt
    m.manual_backward = lambda loss: loss.backward()
    m.on_train_start()
    return m


def test_networks_shapes_and_dueling_identity():
    mlp = make_q_network("mlp", (4,), 3, (8, 8))
    assert mlp(torch.randn(5, 4)).shape == (5, 3)
    cnn = make_q_network("nature_cnn", (4, 84, 84), 6, (32,), dueling=True)
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    q = cnn(frames)
    assert q.shape == (2, 6) and q.dtype == torch.float32
    h = cnn.torso(frames)
    torch.testing.assert_close(q.mean(-1, keepdim=True), cnn.value(h))  # mean_a Q = V (Wang et al.)
    with pytest.raises(ValueError, match="nature_cnn"):
        make_q_network("nature_cnn", (4,), 2)


@pytest.mark.parametrize("kwargs, match", [
    ({"gamma": 1.5}, "gamma"),
    ({"n_step": 0}, "n_step"),
    ({"lr": 0.0}, "lr"),
    ({"target_tau": 0.0}, "target_tau"),
    ({"replay_ratio": -1.0}, "replay_ratio"),
    ({"epsilon_end": 2.0}, "epsilon_end"),
    ({"updates_per_epoch": 0}, "updates_per_epoch"),
    ({"hidden_sizes": []}, "hidden_sizes"),
    ({"network": "transformer"}, "network"),
    ({"replay": ReplayConfig(batch_size=0)}, "replay.batch_size"),
    ({"replay": ReplayConfig(capacity=8, batch_size=16)}, "replay.batch_size"),
    ({"replay": ReplayConfig(alpha=1.5)}, "replay.alpha"),
    ({"replay": ReplayConfig(sampler="greedy")}, "replay.sampler"),
    ({"env": EnvConfig(num_envs=0)}, "env.num_envs"),
])
def test_bad_arguments_raise_value_errors_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DQN(**kwargs)


def test_warmup_fills_the_buffer_and_a_step_updates_everything():
    m = _module(target_update_interval=2, updates_per_epoch=2)  # host counters are recorded at epoch end
    assert len(m.rb) >= 16 and m.env_steps >= 64
    before = [p.clone() for p in m.q_net.parameters()]
    loss = m.training_step(0, 0)
    assert torch.isfinite(loss) and loss.ndim == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, m.q_net.parameters()))
    assert m.updates == 1
    assert any(not torch.equal(a, b) for a, b in zip(m.q_net.parameters(), m.target_net.parameters()))
    m.training_step(1, 1)  # second update: hard copy
    assert all(torch.equal(a, b) for a, b in zip(m.q_net.parameters(), m.target_net.parameters()))
    values = m.metrics.compute()
    for name in ("loss", "td_abs_mean", "td_abs_max", "q_mean", "is_weight_mean", "beta"):
        assert torch.isfinite(values[name]), name
    assert values["updates"].item() == 2 and values["env_steps"].item() == m.env_steps
    assert m.rb.sampler.beta > 0.4  # annealing moved


def test_priorities_follow_td_errors():
    m = _module()
    batch = m.rb.sample()
    m.rb.update_priority(batch["index"], torch.full((16,), 7.0))
    captured = {}
    original = m.rb.update_priority
    m.rb.update_priority = lambda i, p: (captured.update(index=i, prio=p), original(i, p))
    m.training_step(0, 0)
    assert captured["prio"].shape == (16,) and (captured["prio"] >= 0).all()
    assert captured["index"].dtype == torch.int64


def test_polyak_target_moves_a_fraction():
    m = _module(target_tau=0.5)
    t0 = [p.clone() for p in m.target_net.parameters()]
    m.training_step(0, 0)
    for old, new, online in zip(t0, m.target_net.parameters(), m.q_net.parameters()):
        torch.testing.assert_close(new, 0.5 * old + 0.5 * online)


def test_episode_ring_records_finished_episodes():
    m = _module()
    for i in range(20):
        m.training_step(i, i)
    count = int(m.episode_returns_count)
    assert count > 0
    ring = m.episode_returns_ring
    assert (~torch.isnan(ring)).sum().item() == min(count, 100)
    assert (ring[~torch.isnan(ring)] >= 1).all()


def test_checkpoint_state_round_trip_gives_identical_future_samples():
    a = _module(seed=3)
    for i in range(5):
        a.training_step(i, i)
    ckpt = {"state_dict": a.state_dict(), "optimizer": a.optimizers().state_dict()}
    a.on_save_checkpoint(ckpt)
    buf = io.BytesIO()
    torch.save(ckpt, buf)  # what Lightning does with it: a snapshot
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=False)
    indices_a = []
    for i in range(5):
        a.training_step(i, i)
        indices_a.append(a.rb.sample()["index"])

    b = _module(seed=99)  # different seed: everything must come from the checkpoint
    b.load_state_dict(ckpt["state_dict"])
    b.on_load_checkpoint(ckpt)
    b.optimizers().load_state_dict(ckpt["optimizer"])
    indices_b = []
    for i in range(5):
        b.training_step(i, i)
        indices_b.append(b.rb.sample()["index"])
    for ia, ib in zip(indices_a, indices_b):
        torch.testing.assert_close(ia, ib)
    for pa, pb in zip(a.q_net.parameters(), b.q_net.parameters()):
        torch.testing.assert_close(pa, pb)
    assert (a.env_steps, a.updates) == (b.env_steps, b.updates)


def test_uniform_sampler_uses_unit_weights():
    m = _module(replay=ReplayConfig(capacity=512, batch_size=16, sampler="uniform"))
    m.training_step(0, 0)
    assert m.metrics.compute()["is_weight_mean"].item() == 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("compile_, sampler, check_syncs, inductor", [
    (True, "proportional", True, False),  # whole update in one CUDA graph
    (False, "proportional", True, False),  # eager, still no host sync
    (True, "uniform", False, False),  # learner-only graph, eager sampling
    (True, "proportional", True, True),  # whole update in one CUDA graph, Inductor's kernels inside
    (False, "proportional", True, True),  # eager with Inductor's kernels
])
def test_cuda_training_steps_without_host_syncs(compile_, sampler, check_syncs, inductor):
    m = DQN(env=EnvConfig(backend="torch", num_envs=8), hidden_sizes=(64, 64), warmup_steps=256,
            replay=ReplayConfig(capacity=4096, batch_size=64, sampler=sampler), compile=compile_,
            target_tau=0.01, inductor=inductor)
    m.to("cuda")
    m.build_runtime("cuda")
    opt = m.configure_optimizers()
    m.optimizers = lambda: types.SimpleNamespace(optimizer=opt, zero_grad=opt.zero_grad, step=opt.step)
    m.manual_backward = lambda loss: loss.backward()
    m.on_train_start()
    for i in range(5):  # capture, lazy CUDA module loading
        m.training_step(i, i)
    before = [p.clone() for p in m.q_net.parameters()]
    torch.cuda.synchronize()
    if check_syncs:
        torch.cuda.set_sync_debug_mode("error")
    try:
        losses = [m.training_step(i, i).clone() for i in range(50)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(torch.stack(losses)).all()
    assert any(not torch.equal(a, b) for a, b in zip(before, m.q_net.parameters()))
    assert m.updates == 55 and int(m.episode_returns_count) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("target", [{"target_tau": 0.01}, {"target_tau": None, "target_update_interval": 4}])
def test_one_graph_of_four_updates_equals_four_one_update_graphs(target):
    """updates_per_graph=4 replays the same 4 updates as 4 single-update replays (the independent reference,
    itself checked against eager updates): same draws, same priorities, one fresh gradient per update.

    No env steps in between (replay ratio 1e6), no beta annealing, and lr = 1e-12 so the weights stay put:
    otherwise Adam (whose step is ~lr whatever the gradient's size) amplifies float rounding differences
    between the two captures into different priorities and samples within a few updates. Adam's moments
    then record every update's gradient: a gradient summed over the block (a missing zero_grad) or other
    samples would change them."""
    runs = []
    for per_graph in (1, 4):
        torch.manual_seed(0)
        m = DQN(env=EnvConfig(backend="torch", num_envs=8), hidden_sizes=(64, 64), warmup_steps=256,
                replay=ReplayConfig(capacity=4096, batch_size=64, beta=0.5, beta_end=0.5), compile=True, lr=1e-12,
                replay_ratio=1e6, updates_per_epoch=12, updates_per_step=4, updates_per_graph=per_graph,
                **target)
        m.to("cuda")
        m.build_runtime("cuda")
        opt = m.configure_optimizers()
        m.optimizers = lambda opt=opt: types.SimpleNamespace(optimizer=opt, zero_grad=opt.zero_grad, step=opt.step)
        m.on_train_start()
        for i in range(3):
            m.training_step(i, i)
        torch.cuda.synchronize()
        assert m.updates == 12 and m.graph_captures == 1
        runs.append((m, opt))
    (one, opt1), (four, opt4) = runs
    for p1, p4 in zip(one.q_net.parameters(), four.q_net.parameters()):
        s1, s4 = opt1.state[p1], opt4.state[p4]
        assert int(s1["step"]) == int(s4["step"]) == 12
        torch.testing.assert_close(s4["exp_avg"], s1["exp_avg"], rtol=1e-4, atol=1e-9)
        torch.testing.assert_close(s4["exp_avg_sq"], s1["exp_avg_sq"], rtol=1e-4, atol=1e-12)
    # raw priorities
    torch.testing.assert_close(four.rb.sampler.core.state.raw, one.rb.sampler.core.state.raw, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(four.metrics.values, one.metrics.values, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(four.metrics.counts, one.metrics.counts)


@pytest.mark.gpu
def test_full_scope_graph_updates_equal_eager_updates():
    """Graph mode (scope "full": sample, learner step and the priority update in one CUDA graph; the priority
    update forked onto a second stream after the forward) draws the same slots and leaves the same priorities,
    Adam moments and metrics as the eager updates (one stream, the priority update after the step). lr = 1e-12 as
    in the test above, so float rounding differences between the graph's kernels and the eager ones are not
    amplified."""
    runs = []
    for compile_ in (False, True):
        torch.manual_seed(0)
        m = DQN(env=EnvConfig(backend="torch", num_envs=8), hidden_sizes=(64, 64), warmup_steps=256,
                replay=ReplayConfig(capacity=4096, batch_size=64, beta=0.5, beta_end=0.5), compile=compile_,
                lr=1e-12, replay_ratio=1e6, updates_per_epoch=12, updates_per_step=4, target_tau=0.01)
        m.to("cuda")
        m.build_runtime("cuda")
        opt = m.configure_optimizers()
        m.optimizers = lambda opt=opt: types.SimpleNamespace(optimizer=opt, zero_grad=opt.zero_grad, step=opt.step)
        m.manual_backward = lambda loss: loss.backward()
        m.on_train_start()
        for i in range(3):
            m.training_step(i, i)
        torch.cuda.synchronize()
        assert m.updates == 12
        runs.append((m, opt))
    (eager, opt_e), (graph, opt_g) = runs
    assert graph.graph_captures == 1
    torch.testing.assert_close(graph.rb.sampler.core.state.raw, eager.rb.sampler.core.state.raw, rtol=1e-5, atol=1e-7)
    for pe, pg in zip(eager.q_net.parameters(), graph.q_net.parameters()):
        torch.testing.assert_close(opt_g.state[pg]["exp_avg_sq"], opt_e.state[pe]["exp_avg_sq"], rtol=1e-4,
                                   atol=1e-12)
    torch.testing.assert_close(graph.metrics.counts, eager.metrics.counts)
    torch.testing.assert_close(graph.metrics.values, eager.metrics.values, rtol=1e-5, atol=1e-6)


def test_updates_per_graph_is_validated():
    with pytest.raises(ValueError, match="updates_per_graph must divide updates_per_step"):
        DQN(env=EnvConfig(backend="torch", num_envs=4), updates_per_epoch=8, updates_per_step=4,
            updates_per_graph=3)
    with pytest.raises(ValueError, match="updates_per_graph=2 needs graph mode"):  # at construction: no run files
        DQN(env=EnvConfig(backend="torch", num_envs=4), updates_per_epoch=8, updates_per_step=4, updates_per_graph=2)
    m = DQN(env=EnvConfig(backend="torch", num_envs=4), updates_per_epoch=8, updates_per_step=4,
            updates_per_graph=2, compile=True)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        m.setup("fit")  # compile=True on the CPU


def test_batch_weight_normalization_reaches_the_sampler():
    """replay.weight_normalization="batch": the largest IS weight of every sampled batch is exactly 1."""
    m = _module(replay=ReplayConfig(capacity=512, batch_size=16, weight_normalization="batch"))
    m.rb.update_priority(torch.arange(4), torch.full((4,), 1e-9))  # near-zero priorities: tiny buffer-min weights
    weights = m.rb.sample()["priority_weight"]
    assert weights.max().item() == 1.0 and (weights > 0).all()


def test_weight_normalization_is_validated():
    with pytest.raises(ValueError, match="replay.weight_normalization"):
        ReplayConfig(weight_normalization="global").validate()


@pytest.mark.parametrize("fused", [True, False])
def test_loaded_adam_moments_take_the_channels_last_layout_of_their_parameter(fused):
    """A checkpoint's Adam moments saved from NCHW weights, loaded for channels-last weights (a Nature CNN
    checkpoint written before it ran channels-last on CUDA): the next step equals the NCHW optimizer's own
    step (the oracle: the same Adam, same state, all NCHW). Without re-laying out the moments the fused
    kernel updates mismatched elements."""
    from lightning_per.dqn.module import _state_in_param_layout

    gen = torch.Generator().manual_seed(0)
    w0, g1, g2 = (torch.randn(8, 4, 3, 3, generator=gen) for _ in range(3))
    ref = w0.clone().requires_grad_()
    opt_ref = torch.optim.Adam([ref], lr=0.1, fused=fused)
    ref.grad = g1.clone()
    opt_ref.step()
    saved = copy.deepcopy(opt_ref.state_dict())  # a checkpoint's copy, not the live moments
    nhwc = ref.detach().clone().contiguous(memory_format=torch.channels_last).requires_grad_()
    opt = torch.optim.Adam([nhwc], lr=0.1, fused=fused)
    opt.register_load_state_dict_post_hook(_state_in_param_layout)
    opt.load_state_dict(saved)
    assert all(t.stride() == nhwc.stride() for t in opt.state[nhwc].values() if t.shape == nhwc.shape)
    ref.grad, nhwc.grad = g2.clone(), g2.clone().contiguous(memory_format=torch.channels_last)
    opt_ref.step()
    opt.step()
    torch.testing.assert_close(nhwc.detach(), ref.detach(), rtol=0, atol=1e-6)
