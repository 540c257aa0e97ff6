"""Buffers of every sampler pickle, deep-copy and cross a real ``spawn`` process boundary (as an argument of a
``Process`` and on a queue) with the same contents and the same next draws on both sides.

Each child gets the buffers, samples once from each and sends back the drawn slots and the stored values it read
there; the parent compares them with the values it wrote and with the next draw of a deep copy made before the
child started (and of the buffer itself). A child that dies while it unpickles makes the queue ``get`` time out,
so a regression fails instead of hanging.
"""

from __future__ import annotations

import copy
import pickle
import queue
import time

import pytest
import torch
import torch.multiprocessing as mp
from tensordict import TensorDict

from lightning_per import GPUSliceSampler, make_replay_buffer

KINDS = ("uniform", "proportional", "rank", "slice", "prioritized_slice", "frame_stack")
N, B = 16, 4
_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
_TIMEOUT_S = 240  # a spawned child imports torch, torchrl and the package first


def _written(kind: str) -> TensorDict:
    """The transitions written into a buffer of ``kind`` (each slot's ``obs`` is its own number)."""
    data = {"obs": torch.arange(N, dtype=torch.float32), "episode": torch.arange(N) // 8}
    if kind == "frame_stack":  # stacks of 2 frames of 3 bytes, consecutive steps sharing a frame
        frames = torch.arange(N + 2, dtype=torch.uint8)[:, None].expand(N + 2, 3)
        data["observation"] = torch.stack([frames[:N], frames[1:N + 1]], 1)  # [N, 2, 3]
        data["next_observation"] = torch.stack([frames[1:N + 1], frames[2:N + 2]], 1)
    return TensorDict(data, [N])


def _build(kind: str, device: str, generator: bool, loaded: bool = False):
    """A buffer of ``kind`` holding :func:`_written`, with priorities set and one draw made. ``loaded``: another
    buffer of it (another generator) whose sampler loaded that one's sampler state_dict: until its next draw the
    sampler keeps the restored stream under the generator attached at the load (what a copy must keep too)."""
    kw = dict(device=device, seed=1, generator=torch.Generator().manual_seed(5) if generator else None)
    if kind in ("slice", "prioritized_slice"):
        kw.update(slice_len=2, traj_key="episode")
    if kind == "frame_stack":
        kw.update(frame_stack=2, frames=200)
    rb = make_replay_buffer(N, B, sampler="proportional" if kind == "frame_stack" else kind, **kw)
    rb.extend(_written(kind).to(device))
    rb.update_priority(torch.arange(N, device=device), torch.arange(1.0, N + 1, device=device))
    rb.sample()
    if not loaded:
        return rb
    kw["generator"] = torch.Generator().manual_seed(99) if generator else None
    other = make_replay_buffer(N, B, sampler="proportional" if kind == "frame_stack" else kind, **kw)
    other.extend(_written(kind).to(device))
    other.sampler.load_state_dict(rb.sampler.state_dict())
    return other


def _draw(rb) -> tuple[list[int], list[float]]:
    """One draw: the slots and the ``obs`` stored there, as lists (what a child sends back)."""
    batch = rb.sample()
    return batch["index"].cpu().tolist(), batch["obs"].cpu().tolist()


def _child(results, inbox, buffers) -> None:
    """Sample once from each buffer given as an argument and each received on ``inbox``; send the draws back."""
    for name, rb in buffers.items():
        results.put((name, "argument", _draw(rb), len(rb)))
    name, rb = inbox.get(timeout=_TIMEOUT_S)
    results.put((name, "queue", _draw(rb), len(rb)))
    results.put(("done", None, None, None))


def _cases(device: str) -> dict[str, object]:
    cases = {}
    for kind in KINDS:
        for generator in (False, True):
            cases[f"{kind}-{'generator' if generator else 'seed'}"] = _build(kind, device, generator)
    cases["proportional-loaded"] = _build("proportional", device, True, loaded=True)
    cases["rank-loaded"] = _build("rank", device, True, loaded=True)
    return cases


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=_CUDA)])
def spawned(request):
    """Run one spawned child over every case of :func:`_cases` (one process: each costs seconds to start);
    return ``(device, {case: draws and length the child saw}, {case: the parent's next draw of a deep copy made
    before the child started}, {case: the buffer's own next draw})``."""
    device = request.param
    cases = _cases(device)
    twins = {name: copy.deepcopy(rb) for name, rb in cases.items()}
    ctx = mp.get_context("spawn")
    results, inbox = ctx.Queue(), ctx.Queue()
    on_queue = "proportional-generator"
    child = ctx.Process(target=_child, args=(results, inbox, {k: v for k, v in cases.items() if k != on_queue}))
    child.start()
    inbox.put((on_queue, cases[on_queue]))
    seen = {}
    deadline = time.monotonic() + _TIMEOUT_S
    try:
        while True:
            try:
                name, route, draw, length = results.get(timeout=1.0)
            except queue.Empty:
                if not child.is_alive() and results.empty():
                    pytest.fail(f"the spawned child died (exit code {child.exitcode}) before sending every draw "
                                f"(got {sorted(seen)}): it could not unpickle a buffer")
                if time.monotonic() > deadline:
                    pytest.fail(f"the spawned child sent nothing for {_TIMEOUT_S} s: it hangs")
                continue
            if name == "done":
                break
            seen[name] = (route, draw, length)
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    twin_draws = {name: _draw(rb) for name, rb in twins.items()}
    own_draws = {name: _draw(rb) for name, rb in cases.items()}
    return device, seen, twin_draws, own_draws


@pytest.mark.parametrize("case", [f"{k}-{g}" for k in KINDS for g in ("seed", "generator")]
                         + ["proportional-loaded", "rank-loaded"])
def test_a_spawned_process_gets_the_contents_and_the_next_draws(spawned, case):
    device, seen, twin_draws, own_draws = spawned
    assert case in seen, f"{case}: the child never sampled it"
    route, (index, obs), length = seen[case]
    assert route == ("queue" if case == "proportional-generator" else "argument")
    assert length == N
    written = _written(case.split("-")[0])["obs"]
    assert obs == written[torch.tensor(index)].tolist()  # the values written at the slots it drew
    assert (index, obs) == twin_draws[case]  # the same draws as a deep copy of the same state
    assert (index, obs) == own_draws[case]  # and as the parent's buffer itself


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("generator", [False, True])
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_pickled_and_deep_copied_buffers_keep_contents_and_next_draws(kind, generator, how):
    rb = _build(kind, "cpu", generator)
    twin = pickle.loads(pickle.dumps(rb)) if how == "pickle" else copy.deepcopy(rb)
    assert type(twin) is type(rb) and type(twin.sampler) is type(rb.sampler) and len(twin) == N
    stored = twin.storage.get(torch.arange(N))
    torch.testing.assert_close(stored["obs"], _written(kind)["obs"], rtol=0, atol=0)
    for _ in range(3):
        assert _draw(twin) == _draw(rb)
    fresh = _written(kind)[:2].clone()
    fresh["obs"] += 100
    twin.extend(fresh)  # the copy is a buffer of its own: the original is unchanged
    torch.testing.assert_close(rb.storage.get(torch.arange(N))["obs"], _written(kind)["obs"], rtol=0, atol=0)
    assert twin.storage.get(torch.arange(2))["obs"].tolist() == [100.0, 101.0]


def test_a_slice_sampler_pickles_and_deep_copies_on_its_own():
    sampler = GPUSliceSampler(N, slice_len=2, traj_key="episode", device="cpu", seed=3)
    rb = make_replay_buffer(N, B, sampler="slice", slice_len=2, traj_key="episode", device="cpu", seed=3)
    rb.extend(_written("slice"))
    for copied in (pickle.loads(pickle.dumps(sampler)), copy.deepcopy(sampler), copy.deepcopy(rb.sampler)):
        assert type(copied) is GPUSliceSampler and copied.slice_len == 2
    twin = copy.deepcopy(rb.sampler)
    index, _ = twin.sample(rb.storage, B)
    want, _ = rb.sampler.sample(rb.storage, B)
    assert index.tolist() == want.tolist()
