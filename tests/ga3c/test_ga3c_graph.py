"""GA3C graph mode (``cuda_graph: true``): the training update captured once in a CUDA graph and replayed.

On the GPU: replays give the parameters, optimizer state and metrics of eager updates on the same batches
(torch RMSprop, RMSpropTF, Adam; with and without the gradient clip), a predictor thread keeps acting and
allocating pinned memory while the update is captured, and a short ``Trainer.fit`` run trains in graph mode.
On the CPU: the option trains eagerly (and identically), and RMSpropTF's capturable step count."""

import logging
import threading
import time
import types
from unittest import mock

import numpy as np
import pytest
import torch

from lightning_per.ga3c import module as ga3c_module
from lightning_per.ga3c.cli import build_trainer
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.module import GA3C
from lightning_per.ga3c.optim import RMSpropTF

OBS = (4, 36, 36)  # small Atari-like frames: the conv net, uint8 input, as on Pong
N_ACTIONS = 6


def _module(**kw) -> GA3C:
    spec = (OBS, np.dtype("uint8"), N_ACTIONS)
    with mock.patch.object(ga3c_module, "probe_env", lambda env_spec: spec):  # no environment is made
        return GA3C(GA3CConfig(network="conv", status_interval_s=0, **kw))


def _batches(n: int, size: int, pin: bool) -> list[dict]:
    """``n`` different host batches as the trainer threads hand them over (pinned for CUDA)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        b = {"obs": torch.randint(0, 256, (size, *OBS), generator=g, dtype=torch.uint8),
             "action": torch.randint(0, N_ACTIONS, (size,), generator=g),
             # versions 0 .. i: with the policy at version i (lag_clock advanced once an update) lags 0 .. i
             "ret": torch.randn(size, generator=g), "version": torch.arange(size, dtype=torch.int64) % (i + 1),
             # what V-trace reads (rollouts of the default t_max = 5 steps; ignored without vtrace)
             "next_obs": torch.randint(0, 256, (size // 5, *OBS), generator=g, dtype=torch.uint8),
             "log_prob": -2 * torch.rand(size, generator=g), "reward": torch.randn(size, generator=g),
             "terminated": torch.rand(size, generator=g) < 0.1, "truncated": torch.rand(size, generator=g) < 0.05}
        out.append({**{k: v.pin_memory() if pin else v for k, v in b.items()}, "size": size,
                    "version_mean": float(b["version"].double().mean())})
    return out


def _eager_update(m: GA3C, opt: torch.optim.Optimizer, batch: dict, i: int) -> torch.Tensor:
    """One update as Lightning's automatic optimization runs it: training_step, zero_grad, backward, clip, step."""
    loss = m.training_step(m.transfer_batch_to_device(batch, m.device, 0), i)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if m.cfg.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(list(m.parameters()), m.cfg.grad_clip)  # Lightning's clip
    opt.step()
    return loss.detach()


def _start(m: GA3C, device: str) -> torch.optim.Optimizer:
    """What Trainer.fit does before the first step (setup, device, optimizer), without a Trainer."""
    m.to(device)
    m.setup("fit")
    m.metrics.to(device)
    opt = m.configure_optimizers()
    m.optimizers = lambda: types.SimpleNamespace(optimizer=opt)
    return opt


# ---------------------------------------------------------------------------------------------- CPU
def test_cuda_graph_on_the_cpu_trains_eagerly_and_identically(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("lightning_per.ga3c"), "propagate", True)  # the CLI may have unset it
    runs = []
    for graph in (False, True):
        m = _module(device="cpu", cuda_graph=graph, optimizer="rmsprop", grad_clip=0.5)
        with caplog.at_level(logging.INFO, logger="lightning_per.ga3c"):
            opt = _start(m, "cpu")
        assert m.automatic_optimization and not opt.param_groups[0]["capturable"]
        losses = [_eager_update(m, opt, b, i) for i, b in enumerate(_batches(3, 20, pin=False))]
        runs.append((m, losses))
    # only the cuda_graph run logs it; distinct records: with the logger made to propagate while pytest also
    # watches it directly (it does for a logger that did not propagate when the test began), caplog sees one twice
    assert len({id(r) for r in caplog.records if "training eagerly" in r.getMessage()}) == 1
    (eager, eager_losses), (graph, graph_losses) = runs
    assert graph.graph_captures == 0
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, graph_losses))
    assert all(torch.equal(a, b) for a, b in zip(eager.parameters(), graph.parameters()))
    assert torch.equal(eager.metrics.values, graph.metrics.values)


def test_rmsprop_tf_capturable_step_count_and_state_dict_round_trip():
    """capturable=True keeps the step count as a 0-d float32 tensor on the parameters' device and changes
    nothing else; init_state() makes the state the first step would; old state dicts (int steps) load."""
    params = [torch.nn.Parameter(torch.tensor([1.0, -2.0])) for _ in range(2)]
    plain, capt = RMSpropTF([params[0]], lr=0.1, eps=0.1), RMSpropTF([params[1]], lr=0.1, eps=0.1, capturable=True)
    capt.init_state()
    state = capt.state[params[1]]
    assert torch.equal(state["square_avg"], torch.ones(2)) and state["step"].dtype == torch.float32
    for g in (torch.tensor([0.5, -1.0]), torch.tensor([2.0, 0.1]), torch.tensor([-0.3, 0.7])):
        for p, opt in zip(params, (plain, capt)):
            p.grad = g.clone()
            opt.step()
    assert torch.equal(params[0], params[1])
    assert plain.state[params[0]]["step"] == 3 and float(capt.state[params[1]]["step"]) == 3.0
    again = RMSpropTF([torch.nn.Parameter(params[1].detach().clone())], capturable=True)
    again.load_state_dict(capt.state_dict())
    loaded = next(iter(again.state.values()))
    assert isinstance(loaded["step"], torch.Tensor) and float(loaded["step"]) == 3.0
    old = plain.state_dict()
    del old["param_groups"][0]["capturable"]  # saved before the option existed
    q = torch.nn.Parameter(params[0].detach().clone())
    older = RMSpropTF([q], lr=0.1, eps=0.1)
    older.load_state_dict(old)
    q.grad = torch.ones(2)
    older.step()
    assert older.param_groups[0]["capturable"] is False and older.state[q]["step"] == 4


# ---------------------------------------------------------------------------------------------- GPU
@pytest.fixture
def exact_cuda_math():
    """float32 matrix products and convolutions without TF32, deterministic cuDNN algorithms."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
     torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = saved


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer, extra", [
    ("rmsprop_tf", {}), ("rmsprop_tf", {"grad_clip": 0.5, "loss_reduction": "sum"}),
    ("rmsprop", {"grad_clip": 0.5, "lr": 7e-4, "rmsprop_eps": 1e-5, "value_coef": 0.5}),  # configs/ga3c_pong.yaml
    ("rmsprop", {}), ("adam", {"grad_clip": 0.5}),
    ("rmsprop", {"grad_clip": 0.5, "lr": 7e-4, "rmsprop_eps": 1e-5, "value_coef": 0.5, "vtrace": True,
                 "envs_per_agent": 4, "vtrace_c_clip": 0.9}),
    ("adam", {"grad_clip": 0.5, "max_policy_lag": 1}),  # lags 0 .. 4 of _batches: rows dropped from the 3rd on
    ("rmsprop", {"vtrace": True, "envs_per_agent": 4, "max_policy_lag": 2, "lag_policy": "downweight"}),
    ("adam", {"grad_clip": 0.5, "lr": 2.5e-4, "adam_eps": 1e-5, "vtrace": True, "loss": "appo",  # docs/ga3c.md
              "ppo_clip": 0.1, "normalize_advantage": True, "max_policy_lag": 2, "envs_per_agent": 4}),
])
def test_graph_updates_equal_eager_updates(optimizer, extra, exact_cuda_math):
    """Five updates on five different batches: the first replay is the first update (the capture's warm-up
    leaves no trace in parameters, optimizer state or metrics), and every later one matches too."""
    eager, graph = (_module(device="cuda", cuda_graph=g, optimizer=optimizer, **extra) for g in (False, True))
    tol = {"rtol": 1e-4, "atol": 1e-5} if optimizer == "adam" else {"rtol": 1e-5, "atol": 1e-6}
    eager_opt, graph_opt = _start(eager, "cuda"), _start(graph, "cuda")
    assert not graph.automatic_optimization and graph_opt.param_groups[0]["capturable"]
    for i, batch in enumerate(_batches(5, 40, pin=True)):
        expected = _eager_update(eager, eager_opt, batch, i)
        assert graph.transfer_batch_to_device(batch, graph.device, 0) is batch  # copied by the replay itself
        loss = graph.training_step(batch, i)
        torch.testing.assert_close(loss, expected, **tol)
        for m in (eager, graph):  # what on_train_batch_end does: the next update is one version later
            m.policy_version += 1
            m.lag_clock.add_(1)
        for p, q in zip(eager.parameters(), graph.parameters()):
            # capturable Adam computes its bias corrections on the device, in float32 tensor ops: a few weights
            # may differ by a few 1e-6 after 5 updates
            torch.testing.assert_close(q, p, **tol)
    assert graph.graph_captures == 1
    torch.testing.assert_close(graph.metrics.values, eager.metrics.values, **tol)
    assert torch.equal(graph.metrics.counts, eager.metrics.counts)
    for p, q in zip(eager.parameters(), graph.parameters()):
        for key, value in eager_opt.state[p].items():
            torch.testing.assert_close(torch.as_tensor(graph_opt.state[q][key]).cpu(), torch.as_tensor(value).cpu(),
                                       rtol=tol["rtol"], atol=1e-7, check_dtype=False)
        assert graph_opt.state[q]["step"].device.type == "cuda" and int(graph_opt.state[q]["step"]) == 5
    clone = graph.make_optimizer(capturable=True)  # a checkpoint's optimizer state round-trips
    clone.load_state_dict(graph_opt.state_dict())
    for q in graph.parameters():
        for key, value in graph_opt.state[q].items():
            assert torch.equal(clone.state[q][key], value) and clone.state[q][key].device == value.device
    graph.teardown("fit")
    assert graph._captured is None


@pytest.mark.gpu
def test_graph_updates_read_the_networks_input_location(exact_cuda_math):
    """A centered network (``obs_loc``, set as ``obs_center_steps`` sets it: before the first update): the replays
    match eager updates of the same centered network, and both differ from the uncentered one's."""
    pong = {"optimizer": "rmsprop", "grad_clip": 0.5, "lr": 7e-4, "rmsprop_eps": 1e-5, "value_coef": 0.5}
    eager, graph, plain = (_module(device="cuda", cuda_graph=g, **pong) for g in (False, True, False))
    loc = torch.rand(OBS, generator=torch.Generator().manual_seed(1)) * 255
    for m in (eager, graph):
        m.net.obs_loc.copy_(loc)
    opts = [_start(m, "cuda") for m in (eager, graph, plain)]
    for i, batch in enumerate(_batches(3, 40, pin=True)):
        expected = _eager_update(eager, opts[0], batch, i)
        torch.testing.assert_close(graph.training_step(batch, i), expected, rtol=1e-5, atol=1e-6)
        uncentered = _eager_update(plain, opts[2], batch, i)
        assert not torch.allclose(uncentered, expected)
        for m in (eager, graph, plain):
            m.policy_version += 1
            m.lag_clock.add_(1)
    for p, q in zip(eager.parameters(), graph.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
    assert graph.graph_captures == 1 and torch.equal(graph.net.obs_loc.cpu(), loc)
    graph.teardown("fit")


@pytest.mark.gpu
def test_capture_while_a_predictor_thread_acts_and_pins_memory():
    """What the predictor and trainer threads do during the first update's capture: forward passes and
    sampling on their own stream, blocking device-to-host copies, pinned allocations. The capture
    (thread_local error mode) and the thread must both be unaffected."""
    m = _module(device="cuda", cuda_graph=True, optimizer="rmsprop", grad_clip=0.5)
    _start(m, "cuda")
    stop, acted, errors = threading.Event(), [], []

    def predictor():
        stream = torch.cuda.Stream()
        try:
            with torch.cuda.stream(stream):
                while not stop.is_set():
                    host = torch.randint(0, 256, (64, *OBS), dtype=torch.uint8).pin_memory()  # a new pinned block
                    action, value, _ = m.act(host.to("cuda", non_blocking=True))
                    action.cpu()  # synchronises, as a predictor answering its agents
                    acted.append(1)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    thread = threading.Thread(target=predictor, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not acted and not errors and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        losses = [m.training_step(b, i).clone() for i, b in enumerate(_batches(4, 40, pin=True))]
    finally:
        stop.set()
        thread.join(10)
    assert not errors, errors
    assert m.graph_captures == 1 and torch.isfinite(torch.stack(losses)).all()
    m.teardown("fit")


@pytest.mark.gpu
def test_graph_mode_fit_trains_cartpole(tmp_path):
    """A short run through the CLI's Trainer (gradient_clip_val set, as there): Lightning's step count,
    the updates budget and the device metrics work under graph mode."""
    cfg = GA3CConfig(agents=2, envs_per_agent=2, predictors=2, trainers=2, device="cuda", cuda_graph=True,
                     grad_clip=0.5, updates_per_epoch=20, max_updates=60, max_time_s=120, status_interval_s=0,
                     target_return=None)
    model = GA3C(cfg)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = build_trainer(cfg, True, False, [], tmp_path)
    trainer.fit(model)
    assert model.graph_captures == 1 and model.policy_version == 60 and trainer.global_step == 60
    loss = model.metrics.compute()["loss"]
    assert torch.isfinite(loss), loss
    after = list(model.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b.cpu()) for a, b in zip(before, after))
    assert model.system_summary["updates"] == 60
