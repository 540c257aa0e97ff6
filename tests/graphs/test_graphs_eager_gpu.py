"""Eager sampler calls served by cached CUDA graphs (``eager_graphs=True``, the CUDA default) give exactly the
results of the same calls without them: same draws, weights, batches and stored priorities, fresh outputs,
no host synchronisation once captured, and no replay of a graph whose tensors were replaced."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from lightning_per import make_replay_buffer

pytestmark = pytest.mark.gpu

N, B = 4096, 256


def _batch(n, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return TensorDict({"observation": torch.randn(n, 51, generator=g),
                       "next_observation": torch.randn(n, 51, generator=g),
                       "action": torch.randint(0, 45, (n,), generator=g),
                       "reward": torch.randn(n, generator=g),
                       "done": torch.zeros(n, dtype=torch.bool)}, [n]).to(device)


def _buffer(packed: bool, graphs: bool, backend: str, sampler: str = "proportional", **kw):
    dev = torch.device("cuda")
    rb = make_replay_buffer(N, B, sampler=sampler, device=dev, packed=packed, backend=backend, **kw,
                            eager_graphs=graphs, generator=torch.Generator().manual_seed(0))
    rb.extend(_batch(N, dev, 1))  # a full ring: priority writes are graph-served too
    return rb


@pytest.mark.parametrize("backend", ["kernels", "reference"])
@pytest.mark.parametrize("packed", [True, False])
def test_graph_served_steps_equal_launches(packed, backend):
    with_g, without = _buffer(packed, True, backend), _buffer(packed, False, backend)
    views = with_g.sampler.capture_view(None, None), without.sampler.capture_view(None, None)
    for i, (x, y) in enumerate(zip(views[0].tensors, views[1].tensors)):
        assert torch.equal(x, y), ("state after the first extend", i)
    for step in range(6):  # step 0 eager, step 1 captures, steps 2.. replay
        a, b = with_g.sample(), without.sample()
        assert set(a.keys()) == set(b.keys())
        assert torch.equal(a["index"], b["index"]), (step, int((a["index"] != b["index"]).sum()), "draws differ")
        for key in a.keys():
            assert torch.equal(a[key], b[key]), (step, key)
        prio = a["reward"].abs() + 0.01 * (step + 1)
        with_g.update_priority(a["index"], prio)
        without.update_priority(b["index"], prio.clone())
        if step == 3:  # extend: slots overwritten, new default priorities (a full ring: graph-served)
            with_g.extend(_batch(64, "cuda", 10 + step))
            without.extend(_batch(64, "cuda", 10 + step))
    s, t = with_g.sampler, without.sampler
    for x, y in zip(s.capture_view(None, None).tensors, t.capture_view(None, None).tensors):
        assert torch.equal(x, y)
    assert len(s.core.graphs) >= 2  # the draw and the write were served by graphs
    assert t.core.graphs is None


@pytest.mark.parametrize("sort_every", [1, 3])
@pytest.mark.parametrize("backend", ["kernels", "reference"])
def test_rank_sampler_graph_served_refresh_and_draw_equal_launches(backend, sort_every):
    """The rank-based sampler's re-sort + draw served by one cached graph per call shape: the same slots and
    weights as launched calls, step after step, ties included (integer-valued priorities: the stable sort's
    order must be reproduced); with ``sort_every=3`` draws without a re-sort are served too; an alpha change
    (prefix sums rebuilt in place) and an extend midway."""
    with_g = _buffer(True, True, backend, "rank", sort_every=sort_every)
    without = _buffer(True, False, backend, "rank", sort_every=sort_every)
    for step in range(10):
        a, b = with_g.sample(), without.sample()
        for key in ("index", "priority_weight", "observation"):
            assert torch.equal(a[key], b[key]), (step, key)
        prio = (a["reward"].abs() * 3).floor() + step  # many ties
        with_g.update_priority(a["index"], prio)
        without.update_priority(b["index"], prio.clone())
        if step == 4:
            with_g.extend(_batch(64, "cuda", 20 + step))
            without.extend(_batch(64, "cuda", 20 + step))
        if step == 6:
            with_g.sampler.alpha = without.sampler.alpha = 0.4
    assert torch.equal(with_g.sampler.core.rule.order, without.sampler.core.rule.order)
    keys = [key for key in with_g.sampler.core.graphs._entries if key[0] == "rank"]
    assert any(key[2] for key in keys)  # a re-sort + draw graph
    if sort_every > 1:
        assert any(not key[2] for key in keys)  # a draw-only graph


def test_outputs_are_fresh_and_syncs_are_zero_after_capture():
    rb = _buffer(True, True, "kernels")
    first = rb.sample()
    keep = {k: v.clone() for k, v in first.items()}
    for _ in range(2):
        rb.update_priority(first["index"], first["reward"].abs() + 0.5)
        rb.sample()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(50):
            d = rb.sample()
            rb.update_priority(d["index"], d["reward"].abs() + 0.01)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for key, value in keep.items():  # later replays did not write into the first call's outputs
        assert torch.equal(first[key], value), key


def test_replaced_state_is_never_replayed():
    rb = _buffer(True, True, "kernels")
    for _ in range(3):
        d = rb.sample()
        rb.update_priority(d["index"], d["reward"].abs() + 0.01)
    sampler = rb.sampler
    assert len(sampler.core.graphs) == 2
    rb.empty()  # reallocates the sampler's state: the graphs pointed at the old tensors
    assert len(sampler.core.graphs) == 0
    rb.extend(_batch(N, "cuda", 2))
    fresh = make_replay_buffer(N, B, device="cuda", packed=True, backend="kernels",
                               eager_graphs=False, generator=torch.Generator().manual_seed(0))
    fresh.extend(_batch(N, "cuda", 2))
    sampler.set_rng_state(fresh.sampler.get_rng_state())
    for _ in range(4):
        a, b = rb.sample(), fresh.sample()
        assert torch.equal(a["index"], b["index"])
        rb.update_priority(a["index"], a["reward"].abs() + 0.01)
        fresh.update_priority(b["index"], b["reward"].abs() + 0.01)
    assert torch.equal(sampler.core.state.leaves, fresh.sampler.core.state.leaves)
