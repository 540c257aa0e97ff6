"""pipelined_updates (DQN graph mode's body: each update's priority write and the next update's draw forked onto
a second stream after its forward) gives the serial loop's results. On the CPU SideStream.fork just calls, so
this checks the reordering itself: write i and draw i+1 move before update i's backward and optimizer step,
which neither reads. The concurrent GPU version is checked against eager updates in tests/dqn/test_dqn_module.py."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from lightning_per import make_replay_buffer
from lightning_per.dqn.learner import learner_step
from lightning_per.graphs.pipeline import SideStream, pipelined_updates

B, OBS, ACTIONS = 16, 4, 3


def _setup():
    g = torch.Generator().manual_seed(0)
    n = 256
    rb = make_replay_buffer(n, B, device="cpu", packed=True, generator=torch.Generator().manual_seed(1))
    rb.extend(TensorDict({"observation": torch.randn(n, OBS, generator=g),
                          "next_observation": torch.randn(n, OBS, generator=g),
                          "action": torch.randint(0, ACTIONS, (n,), generator=g),
                          "reward": torch.randn(n, generator=g), "discount": torch.full((n,), 0.99)}, [n]))
    torch.manual_seed(2)
    q = torch.nn.Sequential(torch.nn.Linear(OBS, 32), torch.nn.ReLU(), torch.nn.Linear(32, ACTIONS))
    target = copy.deepcopy(q).requires_grad_(False)
    return rb, q, target, torch.optim.Adam(q.parameters(), lr=1e-2)


def _inputs(sample):
    _, info, batch = sample
    return {"observation": batch["observation"], "next_observation": batch["next_observation"],
            "action": batch["action"], "reward": batch["reward"], "discount": batch["discount"],
            "weight": info["priority_weight"]}


def test_pipelined_updates_equal_the_serial_loop():
    n_updates = 5
    runs = []
    for pipelined in (False, True):
        rb, q, target, opt = _setup()
        draws = []

        def draw(rb=rb, draws=draws):
            sample = rb.sampler.sample_gather(rb.storage, B)
            draws.append(sample[0].clone())
            return sample

        def learn(i, sample, after_forward=None, q=q, target=target, opt=opt):
            opt.zero_grad(set_to_none=True)
            return learner_step(q, target, opt, _inputs(sample), after_forward=after_forward)

        def write(sample, td_abs, rb=rb):
            rb.sampler.update_priority(sample[0], td_abs, storage=None)

        if pipelined:
            out = pipelined_updates(n_updates, draw, learn, write, SideStream("cpu"))
        else:
            for i in range(n_updates):
                sample = draw()
                out = learn(i, sample)
                write(sample, out["td_abs"])
        runs.append((draws, rb.sampler.core.state.raw.clone(), [p.detach().clone() for p in q.parameters()],
                     out["loss"]))
    (d0, raw0, p0, loss0), (d1, raw1, p1, loss1) = runs
    assert len(d0) == len(d1) == n_updates  # no draw beyond the last update
    for a, b in zip(d0, d1):
        assert torch.equal(a, b)
    assert torch.equal(raw0, raw1)
    for a, b in zip(p0, p1):
        assert torch.equal(a, b)
    assert torch.equal(loss0, loss1)


def test_a_learn_that_never_forks_the_write_raises():
    rb, q, target, opt = _setup()

    def learn(i, sample, after_forward):  # forgets after_forward: the priority write would be skipped
        return learner_step(q, target, opt, _inputs(sample))

    with pytest.raises(RuntimeError, match="after_forward"):
        pipelined_updates(2, lambda: rb.sampler.sample_gather(rb.storage, B), learn,
                          lambda sample, td_abs: None, SideStream("cpu"))
