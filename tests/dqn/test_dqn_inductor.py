"""The Inductor path (``DQN(inductor=True)``, ``lightning_per.dqn.compiled``) against the eager update, on CPU.

Inductor compiles C++ on the CPU: these tests need a working C++ compiler (``gcc``/``g++``, as Inductor
finds it) and fall back to ``backend="aot_eager"`` (same tracing and AOTAutograd backward, no code
generation) where none is found. Compilation dominates their run time (~20-40 s on a 2-core machine;
Inductor's on-disk cache makes reruns faster).
"""

from __future__ import annotations

import contextlib
import copy
import shutil

import pytest
import torch
from test_dqn_module import _module

from lightning_per.dqn import ReplayConfig
from lightning_per.dqn.compiled import CompiledStep, InductorUpdate
from lightning_per.dqn.learner import MetricSlots, learner_step, record_update_metrics_
from lightning_per.dqn.networks import make_q_network
from lightning_per.envs import EnvConfig
from lightning_per.graphs.capturing import no_recompiles
from lightning_per.metrics.accumulator import MetricAccumulator

BACKEND = "inductor" if shutil.which("g++") or shutil.which("c++") else "aot_eager"
_TIGHT = {"rtol": 1e-5, "atol": 1e-6}
_NAMES = {"loss": "mean", "td_abs_mean": "mean", "td_abs_max": "max", "q_mean": "mean",
          "is_weight_mean": "mean", "episode_return": "mean", "clamped_priorities": "last", "beta": "last"}


def _batch(g: torch.Generator, b: int = 32, obs: int = 6, actions: int = 5) -> dict[str, torch.Tensor]:
    return {"observation": torch.randn(b, obs, generator=g), "next_observation": torch.randn(b, obs, generator=g),
            "action": torch.randint(0, actions, (b,), generator=g), "reward": torch.randn(b, generator=g),
            "discount": torch.rand(b, generator=g), "weight": torch.rand(b, generator=g) + 0.1}


@pytest.mark.parametrize("double_dqn", [True, False])
def test_compiled_learner_step_matches_eager(double_dqn):
    torch.manual_seed(0)
    q = make_q_network("mlp", (6,), 5, (16, 16), dueling=True)
    tgt = copy.deepcopy(q).requires_grad_(False)
    q2, tgt2 = copy.deepcopy(q), copy.deepcopy(tgt)
    opt = torch.optim.Adam(q.parameters(), lr=1e-2, fused=True)
    opt2 = torch.optim.Adam(q2.parameters(), lr=1e-2, fused=True)
    fast = InductorUpdate(q2, tgt2, double_dqn=double_dqn, huber_delta=1.0, grad_clip_norm=0.5, backend=BACKEND)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        b = _batch(g)
        opt.zero_grad(set_to_none=True)
        opt2.zero_grad(set_to_none=True)
        ref = learner_step(q, tgt, opt, b, double_dqn=double_dqn, grad_clip_norm=0.5)
        with no_recompiles() if step else contextlib.nullcontext():  # steps after the first: no recompiles
            out = learner_step(q2, tgt2, opt2, b, double_dqn=double_dqn, grad_clip_norm=0.5, loss_fn=fast.loss,
                               clip_fn=fast.clip)
        for key in ("loss", "td", "td_abs", "q", "weight"):
            torch.testing.assert_close(out[key], ref[key], **_TIGHT, msg=f"{key} at step {step}")
        for p, p2 in zip(q.parameters(), q2.parameters()):
            torch.testing.assert_close(p2.grad, p.grad, **_TIGHT)  # clipped gradients
            torch.testing.assert_close(p2, p, **_TIGHT)  # after the Adam step


def test_record_update_metrics_equals_accumulator_adds():
    names = list(_NAMES)
    a, b = MetricAccumulator(_NAMES), MetricAccumulator(_NAMES)
    slots = MetricSlots.of(names, "cpu")
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        td = torch.randn(16, generator=g)
        out = {"loss": td.square().mean(), "td_abs": td.abs(), "q": torch.randn(16, generator=g),
               "weight": torch.rand(16, generator=g)}
        clamped = torch.randint(0, 5, (), generator=g)
        for name, value in (("loss", out["loss"]), ("td_abs_mean", td.abs().mean()), ("td_abs_max", td.abs().max()),
                            ("q_mean", out["q"].mean()), ("is_weight_mean", out["weight"].mean()),
                            ("clamped_priorities", clamped)):
            a.add(name, value)
        record_update_metrics_(b.values, b.counts, slots, out, clamped)
    assert torch.equal(a.values, b.values) and torch.equal(a.counts, b.counts)  # bit for bit


def test_metric_slots_name_missing_metrics():
    with pytest.raises(ValueError, match="td_abs_max"):
        MetricSlots.of(["loss", "td_abs_mean"], "cpu")


def test_module_with_inductor_matches_eager_module():
    """Two updates of the DQN module with and without ``inductor=True`` (same seed, Polyak target, PER)."""
    kw = {"env": EnvConfig(backend="torch", num_envs=4), "replay": ReplayConfig(capacity=512, batch_size=16),
          "hidden_sizes": (16,), "target_tau": 0.1, "seed": 5}
    torch.manual_seed(0)  # the networks' initialisation
    ref = _module(**kw)
    torch.manual_seed(0)
    fast = _module(inductor=True, **kw)
    fast.learner.inductor = InductorUpdate(fast.q_net, fast.target_net, double_dqn=True, huber_delta=1.0,
                                           grad_clip_norm=fast.hparams.grad_clip_norm, slots=fast.learner.slots,
                                           target_tau=0.1, backend=BACKEND)
    for i in range(2):
        torch.testing.assert_close(fast.training_step(i, i), ref.training_step(i, i), **_TIGHT)
    for p, p2 in zip(ref.parameters(), fast.parameters()):  # online and target networks
        torch.testing.assert_close(p2, p, **_TIGHT)
    torch.testing.assert_close(fast.metrics.values, ref.metrics.values, **_TIGHT)
    assert torch.equal(fast.metrics.counts, ref.metrics.counts)


@pytest.mark.gpu
def test_captured_inductor_update_matches_eager_on_cuda():
    """The learner update captured in a CUDA graph with Inductor's kernels = the eager update (3 replays)."""
    from lightning_per.graphs import capture

    torch.manual_seed(0)
    q = make_q_network("mlp", (6,), 5, (64, 64)).cuda()
    tgt = copy.deepcopy(q).requires_grad_(False)
    q2, tgt2 = copy.deepcopy(q), copy.deepcopy(tgt)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3, fused=True, capturable=True)
    opt2 = torch.optim.Adam(q2.parameters(), lr=1e-3, foreach=True, capturable=True)
    fast, stepper = InductorUpdate(q2, tgt2, double_dqn=True, huber_delta=1.0, grad_clip_norm=0.5), CompiledStep(opt2)
    g = torch.Generator().manual_seed(1)

    def step(b):
        opt2.zero_grad(set_to_none=True)
        return learner_step(q2, tgt2, stepper, b, grad_clip_norm=0.5, loss_fn=fast.loss, clip_fn=fast.clip)

    # the first call captures (no recompilation inside) and replays; Inductor's recompilation in the warm-up may
    # synchronise, so no sync check
    graph = capture(step, state=[q2, opt2], check_syncs=False)

    for _ in range(3):
        b = {k: v.cuda() for k, v in _batch(g).items()}
        opt.zero_grad(set_to_none=True)
        ref = learner_step(q, tgt, opt, b, grad_clip_norm=0.5)
        out = graph(b)
        for key in ("loss", "td", "td_abs", "q"):
            torch.testing.assert_close(out[key], ref[key], rtol=1e-4, atol=1e-5)
        for p, p2 in zip(q.parameters(), q2.parameters()):
            torch.testing.assert_close(p2, p, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("clip", [None, 0.05])
def test_compiled_adam_step_matches_fused_adam(clip):
    """CompiledStep (foreach Adam through torch.compile) = torch's fused Adam, step by step (3 steps); with
    ``clip=(params, 0.05)`` = torch's clip_grad_norm_ followed by fused Adam (the clip active every step)."""
    torch.manual_seed(0)
    q = make_q_network("mlp", (6,), 5, (16, 16))
    q2 = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=1e-2, eps=1e-4, fused=True)
    opt2 = torch.optim.Adam(q2.parameters(), lr=1e-2, eps=1e-4, foreach=True)
    stepper = CompiledStep(opt2, backend=BACKEND, clip=None if clip is None else (list(q2.parameters()), clip))
    assert stepper.clips == (clip is not None)
    scale = 1.0 if clip is None else 10.0  # with the clip: gradient norm >> 0.05, so the clip scales
    for step in range(3):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step))
        for net, o in ((q, opt), (q2, opt2)):
            o.zero_grad(set_to_none=True)
            (scale * net(x)).square().mean().backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(q.parameters(), clip)
            assert norm > clip
        opt.step()
        stepper.step()
        for p, p2 in zip(q.parameters(), q2.parameters()):
            if clip is not None:
                torch.testing.assert_close(p2.grad, p.grad, **_TIGHT, msg=f"clipped gradients at step {step}")
            torch.testing.assert_close(p2, p, **_TIGHT, msg=f"parameters after step {step}")
    if clip is None:
        torch.testing.assert_close(opt2.state_dict()["state"][0]["exp_avg"],
                                   opt.state_dict()["state"][0]["exp_avg"], **_TIGHT)
    else:
        with pytest.raises(ValueError, match="max_norm"):
            CompiledStep(opt2, backend=BACKEND, clip=(list(q2.parameters()), 0.0))


def test_sumsq_clip_equals_torch_clip_grad_norm():
    """clip_grad_norm_sumsq_ = torch.nn.utils.clip_grad_norm_ (norm returned and gradients), clipping and not."""
    from lightning_per.dqn.compiled import clip_grad_norm_sumsq_

    torch.manual_seed(0)
    for max_norm in (0.05, 1e6):  # active, inactive
        q = make_q_network("mlp", (6,), 5, (16, 16))
        q2 = copy.deepcopy(q)
        x = torch.randn(8, 6)
        for net in (q, q2):
            (10 * net(x)).square().mean().backward()
        want = torch.nn.utils.clip_grad_norm_(q.parameters(), max_norm)
        got = clip_grad_norm_sumsq_(list(q2.parameters()), max_norm)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        for p, p2 in zip(q.parameters(), q2.parameters()):
            torch.testing.assert_close(p2.grad, p.grad, rtol=1e-6, atol=0)
