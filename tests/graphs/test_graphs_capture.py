"""lightning_per.graphs.capture on CPU: the eager fallback, argument and capturability checks, the device-counter
HardUpdate against TorchRL's own, and the layering (GA3C does not import the DQN package)."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import OneHot, PrioritizedSampler, TensorDictPrioritizedReplayBuffer
from torchrl.modules import MLP, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate
from torchrl.objectives import HardUpdate as TorchRLHardUpdate

from lightning_per import make_replay_buffer
from lightning_per.graphs import CaptureError, HardUpdate, capture, count_optimizer_step


def _recipe(seed: int = 0, capacity: int = 256, batch: int = 32, capturable: bool = True):
    """TorchRL's DQN pieces with our buffer (CPU), filled with random transitions of a 4-d, 3-action task
    (``capturable``: the Adam a capture takes; torch steps a CPU one only with False)."""
    torch.manual_seed(seed)
    spec = OneHot(3)
    actor = QValueActor(MLP(in_features=4, out_features=3, num_cells=[16]), in_keys=["observation"], spec=spec)
    loss = DQNLoss(actor, action_space=spec, delay_value=True, double_dqn=True)
    loss.make_value_estimator(gamma=0.9)
    target = SoftUpdate(loss, eps=0.9)
    opt = torch.optim.Adam(loss.parameters(), lr=1e-2, capturable=capturable)
    rb = make_replay_buffer(capacity, batch, sampler="proportional", device="cpu", alpha=0.6, beta=0.4,
                            priority_key="td_error", generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(100 + seed)
    n = capacity // 2
    rb.extend(TensorDict({"observation": torch.randn(n, 4, generator=g),
                          "action": torch.nn.functional.one_hot(torch.randint(0, 3, (n,), generator=g), 3),
                          "next": {"observation": torch.randn(n, 4, generator=g),
                                   "reward": torch.randn(n, 1, generator=g),
                                   "done": torch.zeros(n, 1, dtype=torch.bool),
                                   "terminated": torch.zeros(n, 1, dtype=torch.bool)}}, [n]))

    def step():
        batch_td = rb.sample()
        out = loss(batch_td)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        target.step()
        rb.update_tensordict_priority(batch_td)
        return out["loss"].detach()

    return step, loss, opt, rb, target


def test_eager_fallback_runs_k_updates_per_call_like_a_plain_loop():
    step_a, loss_a, opt_a, rb_a, target_a = _recipe()
    step_b, loss_b, opt_b, rb_b, _ = _recipe(capturable=False)
    update = capture(step_a, state=[loss_a, opt_a, rb_a, target_a], updates_per_replay=4)
    assert not update.graphed and update.graph is None
    for _ in range(3):
        update()
    for _ in range(12):  # the same updates written as TorchRL's recipe loop
        step_b()
    for (ka, a), (kb, b) in zip(loss_a.state_dict().items(), loss_b.state_dict().items()):
        assert ka == kb and (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), ka
    for a, b in zip(rb_a.sampler.capture_view(None, None).tensors, rb_b.sampler.capture_view(None, None).tensors):
        assert torch.equal(a, b)
    # the capturable Adam stepped as torch's CPU Adam: the same moments and step count, and its flag kept
    for p_a, p_b in zip(loss_a.parameters(), loss_b.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_a.state[p_a][key], opt_b.state[p_b][key]), key
    assert all(group["capturable"] for group in opt_a.param_groups)
    assert update.calls == 3


def test_eager_fallback_passes_inputs_and_returns_the_last_output():
    seen = []

    def step(x, td):
        seen.append((x.clone(), td["y"].clone()))
        return {"sum": x.sum() + td["y"].sum(), "n": torch.tensor(len(seen))}

    update = capture(step, state=[], updates_per_replay=2)
    out = update(torch.ones(3), TensorDict({"y": torch.full((3,), 2.0)}, [3]))
    assert out["sum"].item() == 9.0 and out["n"].item() == 2 and len(seen) == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"updates_per_replay": 0}, "updates_per_replay must be an int >= 1"),
    ({"updates_per_replay": 2.0}, "updates_per_replay must be an int >= 1"),
    ({"warmup": 0}, "warmup must be an int >= 1"),
    ({"enabled": True}, "enabled=True needs a CUDA device"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        capture(lambda: None, state=[], **kwargs)


def test_bad_state_entries_are_named():
    with pytest.raises(TypeError, match="must be a callable"):
        capture(3, state=[])
    with pytest.raises(TypeError, match=r"state\[1\] must be a tensor, nn.Module, optimizer"):
        capture(lambda: None, state=[torch.zeros(2), "loss"])
    with pytest.raises(TypeError, match="state must be a list"):
        capture(lambda: None, state=torch.nn.Linear(2, 2))


def _graphed(state):
    """Graph mode's construction-time checks (they run before any CUDA call, so also on a CPU-only host)."""
    return capture(lambda: None, state=state, enabled=True, device="cuda")


def test_a_non_capturable_optimizer_is_refused_by_name():
    net = torch.nn.Linear(2, 2)
    with pytest.raises(CaptureError, match=r"Adam was built with capturable=False.*Adam\(\.\.\., capturable=True\)"):
        _graphed([net, torch.optim.Adam(net.parameters())])
    with pytest.raises(CaptureError, match="RMSprop was built with capturable=False"):
        _graphed([torch.optim.RMSprop(net.parameters())])
    _graphed([torch.optim.Adam(net.parameters(), capturable=True), torch.optim.SGD(net.parameters(), lr=0.1)])


@pytest.mark.torchrl_tree
def test_host_samplers_and_torchrl_hard_update_are_refused_by_name():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4)
    with pytest.raises(CaptureError, match="sampler PrioritizedSampler cannot be captured"):
        _graphed([rb])
    with pytest.raises(CaptureError, match="sampler PrioritizedSampler cannot be captured"):
        _graphed([PrioritizedSampler(16, alpha=0.6, beta=0.4)])
    rank = make_replay_buffer(16, 4, sampler="rank", device="cpu", alpha=0.6, beta=0.4)
    with pytest.raises(CaptureError, match="GPURankBasedSampler refreshes its ranking on a host counter"):
        _graphed([rank])
    _, loss, _, ours, _ = _recipe()
    with pytest.raises(CaptureError, match="TorchRL's HardUpdate counts steps in a Python int.*graphs.HardUpdate"):
        _graphed([loss, TorchRLHardUpdate(loss, value_network_update_interval=3)])
    _graphed([loss, ours, HardUpdate(loss, value_network_update_interval=3)])


#: torch's error for a draw from a CUDA generator that the graph being captured did not register
#: (``CUDAGeneratorState::increase`` in ATen; what tensordict's CudaGraphModule meets over a generator-drawing sampler)
_UNREGISTERED = "Attempt to increase offset for a CUDA generator not in capture mode."


def _raise_unregistered(*args, **kwargs):
    raise RuntimeError(_UNREGISTERED)


def test_a_draw_from_a_generator_the_capture_did_not_register_is_named(monkeypatch):
    """A shuffled draw larger than the device RNG's shuffle serves (here made 4) draws its uniforms from the
    sampler's own generator: inside a capture that did not register it, the error names the generator and the
    ways out; it is what graphs.capture registers."""
    rb = make_replay_buffer(64, 8, device="cpu", alpha=0.6, beta=0.4, backend="kernels", seed=0)
    rb.extend(TensorDict({"x": torch.arange(16.0)}, [16]))
    sampler = rb.sampler
    monkeypatch.setattr(sampler.core.ops, "SHUFFLE_DRAWS", 4)
    assert sampler.capture_view(None, 8).generators == (sampler.generator,)
    monkeypatch.setattr(torch, "rand", _raise_unregistered)
    with pytest.raises(RuntimeError) as info:
        rb.sample()
    message = str(info.value)
    for part in ("GPUPrioritizedSampler.generator", "lightning_per.graphs.capture", "register_generator_state",
                 "draw at most 4 per call", "shuffle_strata=False"):
        assert part in message, (part, message)
    assert isinstance(info.value.__cause__, RuntimeError) and _UNREGISTERED in str(info.value.__cause__)


@pytest.mark.parametrize("B", [8, 300])
def test_shuffled_kernel_draws_use_no_generator(monkeypatch, B):
    """The default sampler (shuffled strata) with the compiled kernels, up to SHUFFLE_DRAWS draws: its uniforms
    come from the device RNG (one launch ranks the strata), so nothing draws from a torch generator, a capture
    needs none registered, and every stratum holds one draw."""
    rb = make_replay_buffer(16 * B, B, device="cpu", alpha=1.0, beta=0.4, backend="kernels", seed=0)
    rb.extend(TensorDict({"x": torch.arange(16.0 * B)}, [16 * B]))
    assert rb.sampler.core.rule.shuffle_strata and rb.sampler.capture_view(None, B).generators == ()
    monkeypatch.setattr(torch, "rand", _raise_unregistered)
    index = rb.sample()["index"]
    # equal priorities: stratum j of B covers slots [16 j, 16 j + 16), one draw in each
    assert sorted((index // 16).tolist()) == list(range(B))
    assert not bool((index.diff() > 0).all())  # not in stratum order


def test_stratum_ordered_kernel_draws_use_no_generator(monkeypatch):
    """shuffle_strata=False with the compiled kernels (the user_loop suite's CudaGraphModule row): the draw takes
    its uniforms from device counters, so nothing draws from a torch generator and nothing needs registering."""
    rb = make_replay_buffer(64, 8, device="cpu", alpha=0.6, beta=0.4, backend="kernels", seed=0,
                            shuffle_strata=False)
    rb.extend(TensorDict({"x": torch.arange(16.0)}, [16]))
    assert rb.sampler.capture_view(None, 8).generators == ()
    monkeypatch.setattr(torch, "rand", _raise_unregistered)
    batch = rb.sample()
    assert batch["index"].shape == (8,) and bool((batch["index"] < 16).all())


def test_other_draw_errors_pass_unchanged(monkeypatch):
    rb = make_replay_buffer(64, 8, device="cpu", alpha=0.6, beta=0.4, backend="reference", seed=0)
    rb.extend(TensorDict({"x": torch.arange(16.0)}, [16]))

    def fail(*args, **kwargs):
        raise RuntimeError("some other failure")

    monkeypatch.setattr(torch, "rand", fail)
    with pytest.raises(RuntimeError, match="^some other failure$"):
        rb.sample()


@pytest.mark.parametrize("interval", [0, 1, 4])
def test_device_hard_update_copies_when_torchrl_hard_update_does(interval):
    """Against TorchRL's HardUpdate (the reference schedule): after every step the target networks are equal."""
    _, loss_a, opt_a, _, _ = _recipe()
    loss_b = copy.deepcopy(loss_a)
    opt_b = torch.optim.SGD(loss_b.parameters(), lr=0.5)
    opt_a = torch.optim.SGD(loss_a.parameters(), lr=0.5)
    ours, theirs = HardUpdate(loss_a, value_network_update_interval=interval), TorchRLHardUpdate(
        loss_b, value_network_update_interval=interval)
    for i in range(3 * (interval + 1) + 2):
        for loss, opt in ((loss_a, opt_a), (loss_b, opt_b)):  # move the online network: copies become visible
            opt.zero_grad()
            sum(p.sum() for p in loss.value_network_params.values(True, True)).backward()
            opt.step()
        ours.step()
        theirs.step()
        for a, b in zip(loss_a.target_value_network_params.values(True, True),
                        loss_b.target_value_network_params.values(True, True)):
            assert torch.equal(a, b), (i, interval)
        assert int(ours.step_count) == theirs.counter


def test_device_hard_update_state_dict_round_trip_and_torchrl_counter():
    _, loss, _, _, _ = _recipe()
    ours = HardUpdate(loss, value_network_update_interval=5)
    for _ in range(3):
        ours.step()
    state = ours.state_dict()
    counter = ours.step_count
    ours.step()
    ours.load_state_dict(state)
    assert ours.step_count is counter and int(counter) == 3  # in place: a captured graph keeps reading it
    ours.load_state_dict({"initialized": True, "counter": 4})  # TorchRL's HardUpdate.state_dict()
    assert int(ours.step_count) == 4
    with pytest.raises(ValueError, match="value_network_update_interval must be an int >= 0"):
        HardUpdate(loss, value_network_update_interval=-1)


def test_count_optimizer_step_runs_the_wrappers_hooks_n_times():
    calls = []

    class Wrapper:
        def _on_before_step(self):
            calls.append("before")

        def _on_after_step(self):
            calls.append("after")

    count_optimizer_step(Wrapper(), n=3)
    assert calls == ["before", "after"] * 3
    count_optimizer_step(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0))  # no hooks: nothing


def test_layering_ga3c_does_not_import_dqn_and_graphs_imports_neither():
    code = ("import sys, lightning_per.graphs; "
            "bad = [m for m in sys.modules if m.startswith(('lightning_per.dqn', 'lightning_per.ga3c'))]; "
            "assert not bad, bad; "
            "import lightning_per.ga3c, lightning_per.ga3c.module; "
            "bad = [m for m in sys.modules if m.startswith('lightning_per.dqn')]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_package_exports_what_a_user_needs_and_the_building_blocks_stay_in_their_modules():
    from lightning_per import graphs
    from lightning_per.graphs.capturing import cuda_graph_capture, gc_paused, no_recompiles
    from lightning_per.graphs.eager import EagerGraphs, eager_graphs_paused
    from lightning_per.graphs.streams import capture_cuda_graph, warm_up_on_side_stream

    assert sorted(graphs.__all__) == ["CapturableSampler", "CaptureError", "CapturedStep", "HardUpdate", "capture",
                                      "count_optimizer_step"]
    assert all(callable(getattr(graphs, name)) for name in graphs.__all__)
    assert all(callable(f) for f in (cuda_graph_capture, gc_paused, no_recompiles, EagerGraphs, eager_graphs_paused,
                                     capture_cuda_graph, warm_up_on_side_stream))
    assert not hasattr(graphs, "CapturedUpdate")
