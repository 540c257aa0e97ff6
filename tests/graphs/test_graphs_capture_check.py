"""graphs.capture on a CPU refuses what a GPU capture would (``check=True``, the default): TorchRL's HardUpdate
(listed or called), optimizers without a capturable step, host reads in the step, and a replay buffer or optimizer
the step uses but ``state`` does not list; a refused first call leaves ``state`` as it was, and a capturable
step passes."""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from test_graphs_capture import _recipe
from torchrl.objectives import HardUpdate as TorchRLHardUpdate

from lightning_per.graphs import CaptureError, HardUpdate, capture


def _stepped(step, loss, opt, rb, target):
    """One unchecked update first, so that Adam has state to be put back."""
    capture(step, state=[loss, opt, rb, target], enabled=False)()


def _frozen(loss, opt, rb) -> list[torch.Tensor]:
    """Copies of everything a refused call must leave as it was: parameters (target ones too), Adam's state,
    the sampler's priorities and its RNG."""
    parts = [t.detach().clone() for t in loss.state_dict().values() if isinstance(t, torch.Tensor)]
    parts += [v.clone() for s in opt.state.values() for v in s.values()]
    parts += [t.clone() for t in rb.sampler.capture_view(None, None).tensors]
    return parts + [v.clone() for v in rb.sampler.get_rng_state().values() if isinstance(v, torch.Tensor)]


def _assert_unchanged(before, loss, opt, rb):
    after = _frozen(loss, opt, rb)
    assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))


def test_a_capturable_step_passes_the_check_and_runs_its_updates():
    step, loss, opt, rb, target = _recipe()
    update = capture(step, state=[loss, opt, rb, target], updates_per_replay=3)
    assert update.checked and not update.graphed
    before = _frozen(loss, opt, rb)
    out = update()
    update()
    assert out.shape == () and update.calls == 2
    assert not all(torch.equal(a, b) for a, b in zip(before, _frozen(loss, opt, rb)))  # it did update
    steps = {int(s["step"]) for s in opt.state.values()}
    assert steps == {6}  # two calls of three updates


def test_torchrl_hard_update_in_state_is_refused_at_capture():
    step, loss, opt, rb, _ = _recipe()
    with pytest.raises(CaptureError, match="TorchRL's HardUpdate counts steps in a Python int.*graphs.HardUpdate"):
        capture(step, state=[loss, opt, rb, TorchRLHardUpdate(loss, value_network_update_interval=3)])


def test_torchrl_hard_update_called_by_the_step_is_refused_and_state_put_back():
    step, loss, opt, rb, target = _recipe()
    _stepped(step, loss, opt, rb, target)
    hard = TorchRLHardUpdate(loss, value_network_update_interval=3)

    def with_hard_update():
        out = step()
        hard.step()
        return out

    update = capture(with_hard_update, state=[loss, opt, rb])
    before = _frozen(loss, opt, rb)
    with pytest.raises(CaptureError, match=r"the step calls `hard` \(HardUpdate\): TorchRL's HardUpdate counts"):
        update()
    _assert_unchanged(before, loss, opt, rb)
    # ours, the same schedule on a device counter, passes
    ours = HardUpdate(loss, value_network_update_interval=3)
    capture(lambda: (step(), ours.step())[0], state=[loss, opt, rb, ours])()


@pytest.mark.parametrize("make, match", [
    (lambda params: torch.optim.Adam(params, lr=1e-3), r"Adam was built with capturable=False.*capturable=True"),
    (lambda params: torch.optim.AdamW(params, lr=1e-3), r"AdamW was built with capturable=False"),
    (lambda params: torch.optim.RMSprop(params, lr=1e-3), r"RMSprop was built with capturable=False"),
    (lambda params: torch.optim.Adagrad(params, lr=1e-3), r"Adagrad has no capturable step"),
    (lambda params: torch.optim.LBFGS(params, lr=1e-3), r"LBFGS has no capturable step"),
])
def test_optimizers_without_a_capturable_step_are_refused_on_cpu(make, match):
    net = torch.nn.Linear(2, 2)
    with pytest.raises(CaptureError, match=match):
        capture(lambda: None, state=[net, make(net.parameters())])
    capture(lambda: None, state=[net, torch.optim.SGD(net.parameters(), lr=0.1)])  # SGD has no step count


#: one host read of the step's loss per spelling (the message must quote its line and give its number)
_READS = {
    "item": lambda out: out.item(),
    "cpu": lambda out: out.cpu(),
    "tolist": lambda out: out.reshape(1).tolist(),
    "numpy": lambda out: out.detach().numpy(),
    "float": lambda out: float(out),
    "if": lambda out: 1 if out > 0 else 0,
    "mask": lambda out: out.reshape(1)[out.reshape(1) > 0],
    "nonzero": lambda out: torch.nonzero(out.reshape(1)),
}


def _reading(kind: str):
    """The recipe's step followed by one host read of the loss, spelled as ``kind``; the read's source line."""
    step, loss, opt, rb, target = _recipe()
    _stepped(step, loss, opt, rb, target)
    read = _READS[kind]

    def reading_step():
        out = step()
        read(out)
        return out

    return reading_step, read, (loss, opt, rb, target)


@pytest.mark.parametrize("kind, what", [
    ("item", r"Tensor.item\(\)"), ("cpu", r"Tensor.cpu\(\)"), ("tolist", r"Tensor.tolist\(\)"),
    ("numpy", r"Tensor.numpy\(\)"), ("float", "a tensor's value read on the host"),
    ("if", "a tensor's value read on the host"), ("mask", "boolean-mask indexing"), ("nonzero", "torch.nonzero"),
])
def test_a_host_read_in_the_step_is_refused_by_line(kind, what):
    reading_step, read, (loss, opt, rb, target) = _reading(kind)
    update = capture(reading_step, state=[loss, opt, rb, target], updates_per_replay=2)
    before = _frozen(loss, opt, rb)
    with pytest.raises(CaptureError) as info:
        update()
    message = str(info.value)
    line = inspect.getsource(read).strip()
    assert f"`{line}` ({__file__}:{read.__code__.co_firstlineno}) reads on the host: " in message, message
    assert re.search(what, message), message
    _assert_unchanged(before, loss, opt, rb)
    assert update.calls == 0


def test_check_false_and_enabled_false_run_the_same_step_unchecked():
    for kwargs in ({"check": False}, {"enabled": False}):
        reading_step, _, (loss, opt, rb, target) = _reading("item")
        update = capture(reading_step, state=[loss, opt, rb, target], **kwargs)
        assert not update.checked
        update()
        assert update.calls == 1


def test_a_replay_buffer_missing_from_state_is_refused_by_name():
    step, loss, opt, rb, target = _recipe()
    update = capture(step, state=[loss, opt, target])
    before = [t.detach().clone() for t in loss.parameters()]
    with pytest.raises(CaptureError, match=r"the step uses `rb` \(GPUPrioritizedReplayBuffer\), which state does "
                                           r"not list.*add it to state="):
        update()
    assert all(torch.equal(a, b) for a, b in zip(before, loss.parameters()))
    capture(step, state=[loss, opt, rb.sampler, target])()  # the sampler alone is what the step changes


def test_an_optimizer_missing_from_state_is_refused_by_name():
    step, loss, opt, rb, target = _recipe()
    with pytest.raises(CaptureError, match=r"the step steps `opt` \(Adam\), which state does not list"):
        capture(step, state=[loss, rb, target])()
