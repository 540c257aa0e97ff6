"""Fused sample + gather (``GPUPrioritizedSampler.sample_gather``, ``GPUTensorStorage.rows_to_batch``,
the replay buffer's direct path, the DQN's captured update) against the unfused path: ``sample`` then
``storage.get(index)`` from the same generator state, and the stored transitions themselves.

Runs the reference backend on every device, and the compiled kernels on CUDA or, without CUDA, on CPU
tensors through Triton's interpreter (``conftest.py`` sets ``TRITON_INTERPRET=1``); the kernel cases on a
CPU device of a CUDA machine check the documented fallback to the reference ops.
"""

from __future__ import annotations

import types

import pytest
import torch
from tensordict import TensorDict

from lightning_per import GPUPrioritizedSampler, GPUTensorStorage, make_replay_buffer
from lightning_per.ops import reference
from lightning_per.replay.errors import EmptyBufferError

CUDA = torch.cuda.is_available()


def _interpreter() -> bool:
    """Whether the kernels were imported under Triton's interpreter (``TRITON_INTERPRET=1``: CPU tensors)."""
    try:
        from lightning_per.ext import _common
    except Exception:  # noqa: BLE001 - no triton: no interpreter either
        return False
    return _common.INTERPRET


def _kernels_here() -> bool:
    """Whether the compiled backend can run on this machine's test device (CUDA, or the interpreter)."""
    return CUDA or _interpreter()


def _kernels_on(device: torch.device) -> bool:
    """Whether ``backend="kernels"`` gets the compiled kernels on ``device`` (``ext.backend.TritonOps``' rule: CUDA
    devices, or CPU under the interpreter); elsewhere :func:`lightning_per.ops.select_backend` falls back to
    the reference ops with a warning (e.g. the CPU case on a CUDA machine, where conftest.py sets no
    interpreter)."""
    return device.type == "cuda" or (device.type == "cpu" and _interpreter())


BACKENDS = ["reference", pytest.param("kernels", marks=pytest.mark.skipif(
    not _kernels_here(), reason="compiled kernels need CUDA or TRITON_INTERPRET=1"))]


def transitions(n: int, start: int = 0) -> TensorDict:
    """n distinguishable transitions of mixed dtypes and shapes: every field of transition i holds i."""
    i = torch.arange(start, start + n)
    return TensorDict({
        "observation": i[:, None].float().expand(n, 3).clone(),
        "pixels": (i % 251)[:, None, None].to(torch.uint8).expand(n, 2, 5).clone(),
        "action": i.clone(),
        "reward": i.float(),
        "discount": i.double() / 7,
        "done": (i % 2 == 1)[:, None],
    }, [n])


def _buffer(device, backend: str, packed: bool = True, capacity: int = 37, batch: int = 8, **kw):
    rb = make_replay_buffer(capacity, batch, device=device, packed=packed, backend=backend, seed=11,
                            generator=torch.Generator().manual_seed(3), **kw)
    rb.extend(transitions(capacity - 5))
    # uneven priorities (integers: exact sums), so the draws are not uniform
    prio = (torch.arange(capacity - 5) % 4 + 1).float()
    rb.update_priority(torch.arange(capacity - 5), prio)
    return rb


def _assert_same_batch(got: TensorDict, want: TensorDict) -> None:
    keys = set(want.keys(include_nested=True, leaves_only=True))
    assert set(got.keys(include_nested=True, leaves_only=True)) == keys
    assert got.batch_size == want.batch_size
    for key in keys:
        g, w = got[key], want[key]
        assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device, key
        assert torch.equal(g, w), key


def _stored(index: torch.Tensor) -> TensorDict:
    """The transitions written at ``index`` (the independent source: what the test stored)."""
    return transitions(64)[index.cpu()]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("normalization", ["buffer", "batch"])
@pytest.mark.parametrize("stratified", [True, False])
def test_sample_gather_equals_sample_then_get(device, backend, packed, normalization, stratified):
    rb = _buffer(device, backend, packed, weight_normalization=normalization, stratified=stratified)
    sampler, storage = rb.sampler, rb.storage
    assert (sampler.core.gather_rows(storage) is not None) == packed
    if backend == "kernels" and _kernels_on(device):
        assert "sample_proportional_gather" in sampler.core.ops.COMPILED
    elif backend == "kernels":  # the documented fallback: the plain-torch reference ops, checked all the same
        assert sampler.core.ops is reference
    for _ in range(2):
        state = sampler.get_rng_state()
        index, info, batch = sampler.sample_gather(storage, 8)
        sampler.set_rng_state(state)
        want_index, want_info = sampler.sample(storage, 8)
        assert torch.equal(index, want_index)
        assert torch.equal(info["priority_weight"], want_info["priority_weight"])
        _assert_same_batch(batch, storage.get(want_index))
        _assert_same_batch(batch.cpu(), _stored(index))
        assert set(info) == {"priority_weight"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("packed", [True, False])
def test_buffer_sample_equals_sampler_sample_then_get(device, backend, packed):
    rb = _buffer(device, backend, packed)
    state = rb.sampler.get_rng_state()
    data, info = rb.sample(return_info=True)
    rb.sampler.set_rng_state(state)
    index, want_info = rb.sampler.sample(rb.storage, 8)
    want = rb.storage.get(index)
    want.set("index", index)
    want.set("priority_weight", want_info["priority_weight"])
    _assert_same_batch(data, want)
    assert torch.equal(info["index"], index)
    assert torch.equal(info["priority_weight"], want_info["priority_weight"])
    _assert_same_batch(data.exclude("index", "priority_weight").cpu(), _stored(index))


def test_with_info_adds_the_buffer_keys(device):
    rb = _buffer(device, "reference")
    index, info, batch = rb.sampler.sample_gather(rb.storage, 8, with_info=True)
    assert torch.equal(batch["index"], index)
    assert torch.equal(batch["priority_weight"], info["priority_weight"])


def test_rank_sampler_never_takes_the_proportional_fused_op(device):
    """The rank-based sampler inherits sample_gather: it must draw by rank (its own sample), not fuse."""
    rb = _buffer(device, "reference", sampler="rank")
    assert rb.sampler.core.gather_rows(rb.storage) is None
    state = rb.sampler.get_rng_state()
    data = rb.sample()
    rb.sampler.set_rng_state(state)
    index, info = rb.sampler.sample(rb.storage, 8)
    assert torch.equal(data["index"], index)
    assert torch.equal(data["priority_weight"], info["priority_weight"])


def test_nested_keys_take_the_fused_path_and_equal_sample_then_get(device):
    storage = GPUTensorStorage(16, device=device, packed=True)
    sampler = GPUPrioritizedSampler(16, 0.6, 0.4, device=device, backend="reference", seed=1)
    data = TensorDict({"obs": torch.arange(10.0)[:, None], "next": {"obs": torch.arange(10.0)[:, None] + 1}}, [10])
    storage.set(torch.arange(10), data)
    sampler.mark_update(torch.arange(10), storage=storage)
    assert storage.gather_rows is not None and sampler.core.gather_rows(storage) is not None  # nested keys pack too
    state = sampler.get_rng_state()
    index, _, batch = sampler.sample_gather(storage, 4)
    sampler.set_rng_state(state)
    want_index, _ = sampler.sample(storage, 4)
    assert torch.equal(index, want_index)
    _assert_same_batch(batch, storage.get(want_index))
    torch.testing.assert_close(batch["next", "obs"].cpu(), index.cpu().float()[:, None] + 1, rtol=0, atol=0)


def test_sample_gather_raises_like_sample(device):
    rb = make_replay_buffer(8, 4, device=device, packed=True, backend="reference")
    with pytest.raises(EmptyBufferError):
        rb.sampler.sample_gather(rb.storage, 4)  # nothing written: no ring yet
    rb.extend(transitions(4))
    assert rb.sampler.core.gather_rows(rb.storage) is not None
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError):
            rb.sampler.sample_gather(rb.storage, bad)
    rb.storage._len = 0  # the ring exists but holds nothing
    with pytest.raises(EmptyBufferError):
        rb.sampler.sample_gather(rb.storage, 4)


def test_rows_to_batch_equals_get(device):
    storage = GPUTensorStorage(20, device=device, packed=True)
    storage.set(torch.arange(20), transitions(20))
    for index in (torch.tensor([3, 0, 19, 3, 7], device=device), torch.tensor([5], device=device)):
        batch = storage.rows_to_batch(storage.ring.rows[index], {"index": index})
        want = storage.get(index)
        for key in want.keys():  # the same views: values, dtypes, shapes and strides
            assert torch.equal(batch[key], want[key]) and batch[key].stride() == want[key].stride(), key
        assert torch.equal(batch["index"], index)
        _assert_same_batch(batch.exclude("index").cpu(), _stored(index))
    plain = GPUTensorStorage(20, device=device)
    plain.set(torch.arange(20), transitions(20))
    assert plain.gather_rows is None
    with pytest.raises(RuntimeError, match="packed"):
        plain.rows_to_batch(torch.zeros(2, 3, dtype=torch.int64, device=device))


def test_dqn_full_update_samples_through_sample_gather(monkeypatch):
    """The DQN's graph-mode update body (run eagerly on the CPU here) reads its batch via sample_gather."""
    from lightning_per.dqn import DQN, ReplayConfig
    from lightning_per.dqn.updates import ReplayGraphUpdate
    from lightning_per.envs import EnvConfig

    m = DQN(env=EnvConfig(backend="torch", num_envs=4), replay=ReplayConfig(capacity=512, batch_size=16),
            hidden_sizes=(16,), warmup_steps=64)
    m.build_runtime("cpu")
    opt = m.configure_optimizers()
    m.optimizers = lambda: types.SimpleNamespace(optimizer=opt, zero_grad=opt.zero_grad, step=opt.step)
    m.on_train_start()
    assert m.rb.sampler.core.gather_rows(m.rb.storage) is not None  # the DQN's replay is packed by default
    seen = []
    original = m.rb.sampler.sample_gather

    def spy(storage, batch_size, **kw):
        out = original(storage, batch_size, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(m.rb.sampler, "sample_gather", spy)
    opt.zero_grad(set_to_none=True)
    out = ReplayGraphUpdate(m).body(1)()
    assert len(seen) == 1 and torch.isfinite(out["loss"])
    index, info, batch = seen[0]
    assert index.shape == (16,) and torch.equal(batch["reward"], m.rb.storage.get(index)["reward"])


def test_wide_rows_take_the_separate_gather(monkeypatch):
    """Rows wider than FUSED_GATHER_MAX_WORDS (e.g. Atari frame stacks) are read by storage.get, not copied
    by the sample kernel: same batch as the fused path would give, without the fused op."""
    from lightning_per.replay import core

    rb = _buffer("cpu", "reference")
    narrow = rb.storage.gather_rows.shape[1]
    assert rb.sampler.core.gather_rows(rb.storage) is not None
    monkeypatch.setattr(core, "FUSED_GATHER_MAX_WORDS", narrow - 1)
    assert rb.sampler.core.gather_rows(rb.storage) is None
    calls = []
    monkeypatch.setattr(rb.sampler.core.ops, "sample_proportional_gather",
                        lambda *a, **k: calls.append(1), raising=False)
    state = rb.sampler.get_rng_state()
    index, info, batch = rb.sampler.sample_gather(rb.storage, 8)
    rb.sampler.set_rng_state(state)
    want_index, want_info = rb.sampler.sample(rb.storage, 8)
    assert not calls and torch.equal(index, want_index)
    torch.testing.assert_close(info["priority_weight"], want_info["priority_weight"], rtol=0, atol=0)
    assert (batch == rb.storage.get(want_index)).all()
