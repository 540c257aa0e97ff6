"""lightning_per.graphs.capture on CUDA, with TorchRL's own pieces: a captured call equals the same number of
eager updates from the same seed (weights, Adam state, priorities, sampler RNG), the examples' captured updates
make no host sync over 1,000 updates, the device-counter HardUpdate, EGreedyModule and the default generator,
a compiled loss inside the graph, and the errors that name what cannot be captured.

The eager twins are the reference: the same step function called eagerly (``enabled=False``) on a second,
identically seeded set of objects. lr = 1e-12 where whole DQN updates are compared (as in the DQN module's
graph tests): Adam's step is ~lr whatever the gradient, so a larger lr would amplify float rounding
differences between the graph's and the eager kernels into different priorities and samples; Adam's moments
and the priorities still record every update's gradient and TD error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _examples import load_example
from tensordict import TensorDict
from tensordict.nn import TensorDictSequential
from torchrl.data import OneHot
from torchrl.data.replay_buffers.scheduler import LinearScheduler
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate
from torchrl.objectives import HardUpdate as TorchRLHardUpdate

from lightning_per import make_replay_buffer
from lightning_per.graphs import CaptureError, HardUpdate, capture

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).parents[2]
OBS, ACTIONS = 51, 45


def _transitions(n: int, obs: int, actions: int, device, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    action = torch.nn.functional.one_hot(torch.randint(0, actions, (n,), generator=g), actions)
    return TensorDict({"observation": torch.randn(n, obs, generator=g), "action": action,
                       "next": {"observation": torch.randn(n, obs, generator=g),
                                "reward": torch.randn(n, 1, generator=g),
                                "done": torch.rand(n, 1, generator=g) < 0.05,
                                "terminated": torch.rand(n, 1, generator=g) < 0.05}}, [n]).to(device)


def _recipe(*, backend: str = "kernels", hard: int | None = None, compile_loss: bool = False, lr: float = 1e-12,
            capacity: int = 4096, filled: int = 2048, batch: int = 64, shuffle_strata: bool = True):
    """TorchRL's DQN recipe pieces on CUDA with our buffer (partly filled), seeded identically on every call."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    spec = OneHot(ACTIONS, device=dev)
    actor = QValueActor(MLP(in_features=OBS, out_features=ACTIONS, num_cells=[64, 64], device=dev),
                        in_keys=["observation"], spec=spec)
    loss = DQNLoss(actor, action_space=spec, delay_value=True, double_dqn=True)
    loss.make_value_estimator(gamma=0.99)
    target = HardUpdate(loss, value_network_update_interval=hard) if hard is not None else SoftUpdate(loss, tau=0.05)
    opt = torch.optim.Adam(loss.parameters(), lr=lr, capturable=True)
    rb = make_replay_buffer(capacity, batch, sampler="proportional", device=dev, alpha=0.6, beta=0.4,
                            priority_key="td_error", backend=backend, generator=torch.Generator().manual_seed(0),
                            shuffle_strata=shuffle_strata)
    rb.extend(_transitions(filled, OBS, ACTIONS, dev, seed=1))
    loss_fn = torch.compile(loss) if compile_loss else loss

    def step():
        batch_td = rb.sample()
        out = loss_fn(batch_td)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        target.step()
        rb.update_tensordict_priority(batch_td)
        return {"loss": out["loss"].detach(), "weight": batch_td["priority_weight"], "index": batch_td["index"]}

    return step, loss, opt, rb, target


def _compare(a, b, rtol=1e-5, atol=1e-7):
    (_, loss_a, opt_a, rb_a, target_a), (_, loss_b, opt_b, rb_b, target_b) = a, b
    for (k, x), (_, y) in zip(loss_a.state_dict().items(), loss_b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol, msg=k)  # online and target networks
    for pa, pb in zip(opt_a.param_groups[0]["params"], opt_b.param_groups[0]["params"]):
        sa, sb = opt_a.state[pa], opt_b.state[pb]
        assert int(sa["step"]) == int(sb["step"])
        torch.testing.assert_close(sa["exp_avg"], sb["exp_avg"], rtol=1e-4, atol=1e-9)
        torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"], rtol=1e-4, atol=1e-12)
    s, t = rb_a.sampler, rb_b.sampler
    torch.testing.assert_close(s.core.state.raw, t.core.state.raw, rtol=rtol, atol=atol)  # raw priorities, every slot
    ra, rb_ = s.get_rng_state(), t.get_rng_state()
    assert torch.equal(ra["generator"], rb_["generator"])
    if ra["device_rng"] is not None:
        assert torch.equal(ra["device_rng"], rb_["device_rng"])  # the compiled draws' counters
    if isinstance(target_a, HardUpdate):
        assert int(target_a.step_count) == int(target_b.step_count)


@pytest.mark.parametrize("backend", ["kernels", "reference"])  # device-RNG draws / the sampler's generator
@pytest.mark.parametrize("hard", [None, 3])  # SoftUpdate / our HardUpdate (copies at updates 4, 8, ...)
def test_captured_calls_equal_eager_updates_from_the_same_seed(backend, hard):
    """6 calls of 4 captured updates == 24 eager updates: same slots drawn, IS weights (beta annealed by
    TorchRL's LinearScheduler between calls), priorities, Adam moments, sampler RNG. The buffer is half full and
    grows between calls, so the graph's priority writes reach slots filled after the capture."""
    runs = []
    for enabled in (True, False):
        step, loss, opt, rb, target = parts = _recipe(backend=backend, hard=hard)
        update = capture(step, state=[loss, opt, rb, target], updates_per_replay=4, enabled=enabled)
        beta = LinearScheduler(rb, param_name="beta", final_value=1.0, num_steps=6)
        outs = []
        for call in range(6):
            out = update()
            outs.append({k: v.clone() for k, v in out.items()})
            rb.extend(_transitions(64, OBS, ACTIONS, "cuda", seed=10 + call))
            beta.step()
        torch.cuda.synchronize()
        assert update.graphed is enabled and (update.graph is not None) is enabled
        runs.append((parts, outs))
    (graphed, outs_g), (eager, outs_e) = runs
    for call, (og, oe) in enumerate(zip(outs_g, outs_e)):
        assert torch.equal(og["index"], oe["index"]), (call, "different slots drawn")
        torch.testing.assert_close(og["weight"], oe["weight"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(og["loss"], oe["loss"], rtol=1e-5, atol=1e-7)
    assert not torch.equal(outs_g[0]["weight"], outs_g[-1]["weight"])  # beta reached the graph
    assert any(bool((o["index"] >= 2048).any()) for o in outs_g[1:])  # slots filled after the capture were drawn
    _compare(graphed, eager)


def test_captured_compiled_loss_equals_eager_compiled_loss():
    """torch.compile(loss) inside the graph (compiled in the warm-up): the same updates as the compiled loss
    called eagerly."""
    runs = []
    for enabled in (True, False):
        torch._dynamo.reset()
        step, loss, opt, rb, target = parts = _recipe(compile_loss=True)
        update = capture(step, state=[loss, opt, rb, target], updates_per_replay=4, enabled=enabled)
        for _ in range(5):
            update()
        torch.cuda.synchronize()
        runs.append(parts)
    _compare(*runs, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("compile_loss", [False, True])
def test_torchrl_example_update_makes_no_host_sync_over_1000_updates(compile_loss):
    ex = load_example("torchrl_dqn_per")
    learner = ex.make_learner(4, OneHot(2), device="cuda", capture=True, compile_loss=compile_loss,
                              updates_per_replay=8)
    rb = learner.rb
    rb.extend(_transitions(2000, 4, 2, "cuda", seed=1))
    beta = LinearScheduler(rb, param_name="beta", final_value=1.0, num_steps=200)
    fresh = _transitions(8, 4, 2, "cuda", seed=2)
    learner.update()  # the capture (warm-up, compilation)
    before = [p.clone() for p in learner.loss.parameters()]
    torch.cuda.synchronize()
    for _ in range(125):  # 1,000 updates, with the example's work between calls (not checked: TorchRL's extend)
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss = learner.update()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        rb.extend(fresh)
        beta.step()
    assert learner.update.graphed and learner.update.calls == 126
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.loss.parameters()))


def test_lightning_example_update_makes_no_host_sync_over_1000_updates():
    ex = load_example("lightning_module_per")
    m = ex.CartPoleDQN(updates_per_step=8, capture=True)
    m.to("cuda")
    m.setup("fit")
    opt = m.configure_optimizers()
    update = m.build_update(opt)
    m.rb.extend(_transitions(2000, 4, 2, "cuda", seed=1))
    update()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(125):  # 1,000 updates
            update()
            m.beta.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert update.graphed and update.calls == 126
    stats = m.metrics.compute()
    assert torch.isfinite(stats["loss"]) and int(m.metrics.counts[0]) == 1008  # every captured update was counted


def test_device_hard_update_in_a_graph_copies_when_torchrl_hard_update_does():
    """Online parameters moved by +1 each step; TorchRL's HardUpdate called eagerly is the reference schedule."""
    runs = []
    for ours in (True, False):
        _, loss, _, _, _ = _recipe()
        updater = HardUpdate(loss, value_network_update_interval=2) if ours else TorchRLHardUpdate(
            loss, value_network_update_interval=2)
        online = list(loss.value_network_params.values(True, True))

        def step(online=online, updater=updater):
            with torch.no_grad():
                torch._foreach_add_(online, 1.0)
            updater.step()

        update = capture(step, state=[loss, updater], updates_per_replay=5) if ours else None
        targets = []
        for _ in range(4):
            if ours:
                update()
            else:
                for _ in range(5):
                    step()
            targets.append([t.clone() for t in loss.target_value_network_params.values(True, True)])
        runs.append(targets)
    for call, (a, b) in enumerate(zip(*runs)):
        for x, y in zip(a, b):
            assert torch.equal(x, y), call


def test_egreedy_actions_and_the_default_generator_replay_as_eager_calls():
    """EGreedyModule draws from the device's default CUDA generator (registered by torch, rolled back by the
    capture) and anneals epsilon in a device buffer: 8 calls of 2 captured steps == 16 eager steps."""
    runs = []
    for enabled in (True, False):
        torch.manual_seed(0)
        spec = OneHot(ACTIONS, device="cuda")
        actor = QValueActor(MLP(in_features=OBS, out_features=ACTIONS, num_cells=[32], device="cuda"),
                            in_keys=["observation"], spec=spec)
        explore = EGreedyModule(spec, eps_init=1.0, eps_end=0.1, annealing_num_steps=40).to("cuda")
        policy = TensorDictSequential(actor, explore)
        obs = TensorDict({"observation": torch.randn(256, OBS, device="cuda")}, [256], device="cuda")

        def act(td, policy=policy, explore=explore):
            with set_exploration_type(ExplorationType.RANDOM):
                out = policy(td.clone())
            explore.step(4)
            return out["action"]

        update = capture(act, state=[explore], updates_per_replay=2, enabled=enabled)
        runs.append(([update(obs).clone() for _ in range(8)], explore.eps.clone()))
    (actions_g, eps_g), (actions_e, eps_e) = runs
    for call, (a, b) in enumerate(zip(actions_g, actions_e)):
        assert torch.equal(a, b), call
    assert not torch.equal(actions_g[0], actions_g[1])  # each replay draws new numbers
    torch.testing.assert_close(eps_g, eps_e)
    assert float(eps_g) < 1.0


def test_a_host_sync_in_the_step_is_named_and_changes_nothing():
    step, loss, opt, rb, target = _recipe(lr=1e-2)

    def synced():
        out = step()
        if out["loss"].item() > 1e9:  # a host read: cannot live in a graph
            pass
        return out

    before = [p.clone() for p in loss.parameters()]
    raw = rb.sampler.core.state.raw.clone()
    update = capture(synced, state=[loss, opt, rb, target])
    with pytest.raises(CaptureError, match=r"`if out\[\"loss\"\]\.item\(\) > 1e9:.*synchronises with the host"):
        update()
    for a, b in zip(before, loss.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(raw, rb.sampler.core.state.raw)


def test_a_python_branch_on_a_tensor_is_named():
    step, loss, opt, rb, target = _recipe()

    def branching():
        out = step()
        return out["loss"] * 2 if out["loss"] > 0 else out["loss"]

    with pytest.raises(CaptureError, match=r"out\[\"loss\"\] > 0.*synchronises with the host"):
        capture(branching, state=[loss, opt, rb, target])()


def test_an_unlisted_non_capturable_optimizer_is_named_at_capture():
    step, loss, _, rb, target = _recipe()
    plain = torch.optim.Adam(loss.parameters(), lr=1e-3)  # capturable=False, stepped but not in state

    def step_plain():
        batch_td = rb.sample()
        out = loss(batch_td)
        plain.zero_grad()
        out["loss"].backward()
        plain.step()
        rb.update_tensordict_priority(batch_td)
        return out["loss"].detach()

    with pytest.raises(CaptureError, match="capturable=True"):
        capture(step_plain, state=[loss, rb, target])()


def test_inputs_are_copied_into_the_static_inputs():
    net = torch.nn.Linear(OBS, 1, device="cuda")
    opt = torch.optim.SGD(net.parameters(), lr=0.0)

    def step(x):
        opt.zero_grad()
        y = net(x).sum()
        y.backward()
        opt.step()
        return y.detach()

    update = capture(step, state=[net, opt])
    xs = [torch.randn(16, OBS, device="cuda") for _ in range(3)]
    got = [update(x).clone() for x in xs]
    with torch.no_grad():
        want = [net(x).sum() for x in xs]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    with pytest.raises(ValueError, match=r"input 0 must have the captured shape \(16, 51\)"):
        update(torch.randn(8, OBS, device="cuda"))


def test_tensordict_cudagraphmodule_replays_our_whole_update():
    """docs/graphs.md: tensordict's CudaGraphModule can wrap the whole update over our buffer (its warm-up calls
    are real updates; the compiled kernels' device-counter draws need no registered generator)."""
    from tensordict.nn import CudaGraphModule

    step, loss, opt, rb, target = _recipe(backend="kernels", lr=1e-3, shuffle_strata=False)
    update = CudaGraphModule(step, warmup=2)
    outs = [update() for _ in range(8)]  # 1 eager warm-up, the capturing call, 6 replays
    idx = [o["index"] for o in outs[2:]]
    assert all(not torch.equal(a, b) for a, b in zip(idx, idx[1:]))  # every replay draws new slots
    assert all(bool(torch.isfinite(o["loss"])) for o in outs)
    assert int(opt.state[opt.param_groups[0]["params"][0]]["step"]) == 8  # every call was one Adam step


# The user_loop suite's ours-cudagraphmodule row, in a child process: CudaGraphModule takes TensorDicts out of
# torch's pytree registry for the rest of the process (tensordict's warning: "irreversible").
_CUDAGRAPHMODULE_ROW = """
import json, sys
import torch
from benchmarks.user_loop import cudagraphmodule_update

update, rb = cudagraphmodule_update(4096, 64, "cuda")  # the row's configuration (the default sampler), small N
losses = [update().clone() for _ in range(2)]  # the first call warms up, the second runs eagerly and captures
before = rb.sampler.core.state.raw.clone()
losses += [update().clone() for _ in range(4)]  # replays
torch.cuda.synchronize()
out = {"finite": bool(torch.isfinite(torch.stack(losses)).all()),
       "distinct_replays": len({round(float(x), 7) for x in losses[2:]}),
       "priorities_changed": int((rb.sampler.core.state.raw != before).sum())}
# the reference ops draw from the sampler's own generator, which CudaGraphModule does not register
update, rb = cudagraphmodule_update(4096, 64, "cuda", sampler_kwargs={"backend": "reference"})
try:
    for _ in range(3):
        update()
    out["default_error"] = None
except RuntimeError as err:
    out["default_error"] = str(err)
print(json.dumps(out))
"""


def test_user_loop_cudagraphmodule_row_replays_the_whole_update_and_names_an_unregistered_generator():
    """tensordict's CudaGraphModule over our buffer registers no generator: with the row's (default) sampler,
    whose draws take their uniforms from the kernels' device RNG, every replay samples anew and the replays write
    priorities; with the reference ops (their draws use the sampler's own generator) the capture fails with the
    error naming it."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _CUDAGRAPHMODULE_ROW], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["finite"] and out["distinct_replays"] == 4 and out["priorities_changed"] > 0, out
    assert out["default_error"] is not None and "GPUPrioritizedSampler.generator" in out["default_error"], out
