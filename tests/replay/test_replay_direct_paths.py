"""The replay's direct (low host overhead) paths against TorchRL's generic ones.

Every direct path (``extend`` straight into the storage, the batch built once with its index and weights,
the packed batch views, the one-``cat`` packed write, the update and ``mark_update`` shortcuts) must leave
exactly the state TorchRL's generic machinery leaves: the reference is the same buffer with the direct
paths switched off (TorchRL's ``extend``/``sample`` code, the writer's generic ``extend``, TensorDict's
indexed assignment), plus TorchRL's own ``TensorDictPrioritizedReplayBuffer`` for the stored data and slots.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch.overrides import TorchFunctionMode
from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer, TensorDictReplayBuffer

from lightning_per import make_replay_buffer
from lightning_per.graphs.state import sampler_view
from lightning_per.replay import GPURoundRobinWriter
from lightning_per.replay import rows as rows_mod
from lightning_per.replay import storage as storage_mod


def transitions(n: int, start: int = 0, priority: bool = False) -> TensorDict:
    """n distinguishable transitions of mixed dtypes and shapes (field values hold the transition number;
    the observation's noise is a function of (n, start): equal calls give equal batches)."""
    i = torch.arange(start, start + n)
    noise = torch.randn(n, 3, generator=torch.Generator().manual_seed(1000 * start + n))
    td = TensorDict({
        "observation": i[:, None].float().expand(n, 3).clone() + noise,
        "pixels": (i % 251)[:, None, None].to(torch.uint8).expand(n, 2, 5).clone(),
        "action": i.clone(),
        "reward": i.float() / 3,
        "discount": i.double() / 7,
        "done": (i % 2 == 1)[:, None],
    }, [n])
    if priority:
        td["td_error"] = (i % 5).float() + 0.5
    return td


def _generic(rb):
    """Switch ``rb``'s direct paths off: TorchRL's extend and writer, and the original storage write."""
    rb._writer._direct_pairs = lambda data: None
    return rb


def _buffers(kind, device, packed, capacity=16, **kw):
    make = lambda: make_replay_buffer(capacity, 4, sampler=kind, device=device, packed=packed, seed=5,  # noqa: E731
                                      generator=torch.Generator().manual_seed(1), **kw)
    return make(), _generic(make())


def _assert_same_state(fast, slow):
    assert len(fast) == len(slow)
    assert fast._writer._cursor == slow._writer._cursor
    assert fast._writer._write_count == slow._writer._write_count
    s_fast, s_slow = fast.storage, slow.storage
    if s_fast.ring.rows is not None:  # every byte of the packed ring, padding included
        assert torch.equal(s_fast.ring.rows.cpu(), s_slow.ring.rows.cpu())
    for key, value in s_slow._storage.items(include_nested=True, leaves_only=True):
        assert torch.equal(s_fast._storage.get(key).cpu(), value.cpu()), key
    for a, b in zip(sampler_view(fast.sampler, None, None).tensors, sampler_view(slow.sampler, None, None).tensors,
                    strict=True):  # none for the uniform sampler
        assert torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("priority", [False, True])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kind", ["proportional", "rank", "uniform"])
def test_direct_extend_equals_torchrl_extend(kind, packed, priority, device):
    fast, slow = _buffers(kind, device, packed)
    # first write (allocation), plain, wrapping, larger than the ring, on the ring's device; with priorities
    # ("td_error", the priority key) the new slots take them instead of the running max
    batches = [transitions(5, 0, priority), transitions(7, 5, priority), transitions(9, 12, priority),
               transitions(20, 21, priority), transitions(3, 41, priority), transitions(6, 44, priority).to(device)]
    for td in batches:
        keys = set(td.keys())
        got = fast.extend(td)
        assert set(td.keys()) == keys  # the caller's batch is not tagged (TorchRL tags a shallow copy)
        want = slow.extend(td.clone())
        assert got.dtype == want.dtype and got.device == want.device and torch.equal(got, want)
        _assert_same_state(fast, slow)
    if kind != "uniform":
        fast.update_priority(torch.arange(16), torch.arange(16.0))
        slow.update_priority(torch.arange(16), torch.arange(16.0))
    td = transitions(4, 50, priority)
    fast.extend(td)
    slow.extend(td.clone())
    _assert_same_state(fast, slow)
    assert torch.equal(fast.sample()["index"], slow.sample()["index"])


class _ConflictingIndexedWrites(TorchFunctionMode):
    """Counts indexed assignments ``t[index] = value`` (1-D int64 ``index``) that write one slot twice with
    different values: undefined (``Tensor.index_put_``); on CUDA concurrent threads write the slot in no
    fixed order, so such a write is caught here on any device."""

    def __init__(self):
        super().__init__()
        self.conflicts = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__setitem__:
            _, index, value = args
            if (isinstance(index, torch.Tensor) and index.dtype == torch.long and index.ndim == 1
                    and isinstance(value, torch.Tensor) and value.shape[:1] == index.shape):
                last = {}
                for position, slot in enumerate(index.tolist()):
                    last[slot] = position
                winners = torch.tensor([last[slot] for slot in index.tolist()], device=value.device)
                self.conflicts += not torch.equal(value, value[winners])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kind", ["proportional", "uniform"])
def test_batch_longer_than_the_ring_keeps_each_slots_last_write(kind, packed, device):
    """A batch of more than ``capacity`` items wraps onto itself: each slot holds its last write (as a write
    of the items one by one would leave it), on the direct and the generic path, and no write repeats a
    slot with different values (which CUDA resolves in no fixed order)."""
    fast, slow = _buffers(kind, device, packed)
    for rb in (fast, slow):
        rb.extend(transitions(5))
        with _ConflictingIndexedWrites() as mode:
            rb.extend(transitions(20, 5).to(device))  # slots 5..15, 0..8: 5..8 written twice
        assert mode.conflicts == 0
        assert len(rb) == 16 and rb._writer._cursor == 25 % 16 and rb._writer._write_count == 25
        stored = rb.storage.get(torch.arange(16, device=device)).cpu()
        want = transitions(20, 5)[(torch.arange(16) - 9) % 16 + 4]  # slot s: the last item i with (5 + i) % 16 == s
        for key in want.keys():
            assert torch.equal(stored[key], want[key]), key
    _assert_same_state(fast, slow)


@pytest.mark.parametrize("packed", [False, True])
def test_direct_extend_matches_torchrl_buffer(packed, device):
    """Slots, lengths and stored rows of TorchRL's own prioritized buffer on a LazyTensorStorage."""
    ours = make_replay_buffer(16, 4, device=device, packed=packed)
    try:
        theirs = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(16, device=device))
    except RuntimeError as err:  # its C++ sum tree did not load (torchrl wheels built for another torch)
        pytest.skip(f"TorchRL's prioritized buffer is unavailable here: {err}")
    for td in (transitions(5), transitions(7, 5), transitions(9, 12)):
        assert torch.equal(ours.extend(td).cpu(), theirs.extend(td.clone()).cpu())  # same noise: one batch
        assert len(ours) == len(theirs)
    stored = ours.storage.get(torch.arange(16, device=device))
    for key, value in theirs.storage._storage.exclude("index").items():
        assert torch.equal(stored[key].cpu(), value.cpu()), key


def test_rejected_extend_changes_nothing_and_raises_like_torchrl(device):
    fast, slow = _buffers("proportional", device, packed=True)
    for rb in (fast, slow):
        rb.extend(transitions(5))
    bad_dtype = transitions(3)
    bad_dtype["reward"] = bad_dtype["reward"].double()
    bad_nested = transitions(3)
    bad_nested["nested"] = TensorDict({"x": torch.zeros(3)}, [3])
    for bad, err in ((transitions(3).exclude("done"), ValueError), (bad_dtype, TypeError),
                     (bad_nested, ValueError), (transitions(2)[None], ValueError)):
        for rb in (fast, slow):
            with pytest.raises(err):
                rb.extend(bad)
        _assert_same_state(fast, slow)


def test_storage_set_with_a_cursor_that_does_not_fit_keeps_the_length(device):
    rb = make_replay_buffer(16, 4, device=device)
    rb.extend(transitions(5))
    storage = rb.storage
    cursor = storage._last_cursor
    with pytest.raises(RuntimeError):
        storage.set(torch.arange(5, 8), transitions(2))  # 3 slots for 2 transitions
    assert len(storage) == 5 and storage._last_cursor is cursor


@pytest.mark.filterwarnings("ignore:Got conflicting batch_sizes")
@pytest.mark.parametrize("packed", [False, True])
def test_direct_sample_equals_torchrl_sample(packed, device):
    fast, slow = _buffers("proportional", device, packed, capacity=37)
    for rb in (fast, slow):
        rb.extend(transitions(30))
        rb.update_priority(torch.arange(30), (torch.arange(30) % 4 + 1).float())
    for batch_size in (1, 2, 8):
        got = fast.sample(batch_size)
        want = TensorDictReplayBuffer.sample(slow, batch_size)  # TorchRL: sample, get, collate, set the info
        # key order aside (the direct path puts "index" before "priority_weight", as it always has)
        assert set(got.keys()) == set(want.keys()) and got.batch_size == want.batch_size
        assert got.device == want.device
        for key in want.keys():
            a, b = got[key], want[key]
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), key
            assert torch.equal(a, b), key


@pytest.mark.parametrize("n", [0, 1, 2, 3, 64])
def test_batch_views_are_field_views(n):
    """The packed batch's fields hold the bytes of the ring's field views, each as a contiguous tensor in memory of
    its own (not the block's, not another field's)."""
    spec = {"x": ((2, 1, 3), torch.float16), "y": ((0,), torch.float64), "z": ((1,), torch.int8),
            "w": ((4, 4), torch.complex64), "v": ((), torch.float64), "u": ((1, 1), torch.uint8),
            "t": ((5,), torch.bfloat16), "a": ((), torch.int64), "d": ((), torch.bool)}
    layout, row_bytes = rows_mod.row_layout(spec)
    plan = rows_mod.view_plan(layout, row_bytes // 8)
    block = torch.randint(-2**62, 2**62, (n, row_bytes // 8))
    want = rows_mod.field_views(block, layout)
    want["d"].copy_(torch.rand(n) < 0.5)  # a bool's byte is 0 or 1 (a copy of another byte normalises it)
    for got in (rows_mod.batch_views(block, layout, plan), rows_mod.batch_views(block, layout, None)):
        assert list(got) == list(want)
        owners = {block.untyped_storage().data_ptr()}
        for key in want:
            a, b = got[key], want[key]
            assert (a.dtype, a.shape) == (b.dtype, b.shape), key
            assert a.is_contiguous(), key
            assert torch.equal(a.view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)), key
            if a.numel():
                assert a.untyped_storage().data_ptr() not in owners, key
                owners.add(a.untyped_storage().data_ptr())


def test_packed_write_leaves_every_byte_as_per_key_writes(device):
    """The one-cat write of a packed batch against TensorDict's per-key indexed assignment, bytes of the
    whole ring compared (fields with several dims, 1-byte and 8-byte types, a zero-size field)."""
    def batch(n, start):
        td = transitions(n, start)
        td["empty"] = torch.zeros(n, 0)
        return td

    fast = make_replay_buffer(16, 2, device=device, packed=True)
    slow = _generic(make_replay_buffer(16, 2, device=device, packed=True))
    for rb in (fast, slow):
        rb.extend(batch(3, 0))
        rb.storage.ring.rows.view(torch.uint8).fill_(0xAB)  # padding bytes must keep whatever they hold
    for n in (4, 5, 6, 16):  # slots 3-6, 7-11, then two wrapping writes (per-key path)
        td = batch(n, 10 * n)
        fast.extend(td)
        slow.extend(td.clone())
        assert torch.equal(fast.storage.ring.rows.cpu(), slow.storage.ring.rows.cpu())


def test_update_priority_shortcuts_equal_the_general_path(device):
    """1-D int64 index and float32 priority skip the flatten/cast; a grad-requiring priority stays out of
    autograd. Compared with the general path (2-D index, float64 priority, detached)."""
    fast, slow = _buffers("proportional", device, packed=False)
    for rb in (fast, slow):
        rb.extend(transitions(12))
    p = torch.rand(12, device=device, dtype=torch.float64) * 3
    weight = torch.ones((), device=device, requires_grad=True)
    fast.update_priority(torch.arange(12, device=device), (p.float() * weight))
    slow.update_priority(torch.arange(12).reshape(3, 4), p.float().double().reshape(12, 1))
    _assert_same_state(fast, slow)
    assert not any(t.requires_grad for t in fast.sampler.capture_view(None, None).tensors)


def test_default_priority_is_the_running_max_or_one(device):
    sampler = make_replay_buffer(8, 2, device=device).sampler
    for value in (float("-inf"), float("inf"), float("nan"), 0.0, 2.5):
        sampler.core.state.max_raw.fill_(value)
        m = sampler.core.state.max_raw
        want = torch.where(torch.isinf(m), torch.ones_like(m), m)
        got = sampler.default_priority
        assert got.shape == () and got.dtype == want.dtype and torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


def test_storage_len_reads_torchrl_length(device):
    rb = make_replay_buffer(8, 2, device=device)
    for n in (0, 3, 8):
        if n:
            rb.extend(transitions(n))
        storage = rb.storage
        assert len(storage) == type(storage).__mro__[1].__len__(storage) == storage._len


def test_writer_direct_extend_tags_the_batch_as_torchrl(device):
    """Called directly, our writer tags the batch with its slots, as TorchRL's writer does."""
    rb = make_replay_buffer(8, 2, device=device, packed=True)
    rb.extend(transitions(3))
    writer = rb._writer
    assert isinstance(writer, GPURoundRobinWriter)
    td = transitions(2)
    index = writer.extend(td)
    assert torch.equal(td["index"], index) and torch.equal(index.cpu(), torch.tensor([3, 4]))


def test_ext_scalar_helpers():
    _common = pytest.importorskip("lightning_per.ext._common")
    struct = pytest.importorskip("struct")
    bits = lambda v: struct.unpack("<q", struct.pack("<d", float(v)))[0]  # noqa: E731
    for value in (0.0, -0.0, 1e-8, 0.4, float("inf"), float("-inf"), 1, 3.0, 0.0, -0.0, 1e-8):
        assert _common.f64_bits(value) == bits(value)
    nan = _common.f64_bits(float("nan"))
    assert nan == bits(float("nan"))
    cpu = torch.device("cpu")
    assert _common.same_device(cpu, torch.device("cpu")) and _common.same_device("cpu", cpu)
    assert not _common.same_device(cpu, torch.device("meta"))


def test_writer_subclass_keeps_its_extend(device):
    """A subclass of our writer that overrides ``extend`` is called (the direct path takes our writer only)."""
    calls = []

    class Counting(GPURoundRobinWriter):
        def extend(self, data):
            calls.append(len(data))
            return super().extend(data)

    from lightning_per import GPUPrioritizedReplayBuffer
    rb = GPUPrioritizedReplayBuffer(alpha=0.6, beta=0.4, device=device, writer=Counting(), batch_size=2,
                                    storage=storage_mod.GPUTensorStorage(8, device=device))
    rb.extend(transitions(3))
    rb.extend(transitions(2, 3))
    assert calls == [3, 2] and len(rb) == 5


def test_custom_collate_takes_torchrl_sample(device):
    """A ``collate_fn`` (which the direct sample path does not apply) sends ``sample`` through TorchRL's."""
    from lightning_per import GPUPrioritizedReplayBuffer
    seen = []

    def collate(batch):
        seen.append(batch.batch_size)
        return batch

    rb = GPUPrioritizedReplayBuffer(alpha=0.6, beta=0.4, device=device, collate_fn=collate, batch_size=3,
                                    storage=storage_mod.GPUTensorStorage(8, device=device))
    rb.extend(transitions(5))
    batch = rb.sample()
    assert seen == [torch.Size([3])] and {"index", "priority_weight"} <= set(batch.keys())
    default = GPUPrioritizedReplayBuffer(alpha=0.6, beta=0.4, device=device, batch_size=3)
    assert default._direct_sample and not rb._direct_sample


def test_generation_tracking_takes_torchrl_sample(device):
    """A writer that tracks generations (torchrl >= 0.14) gets TorchRL's sample, which adds "index_generation"."""
    try:
        writer = GPURoundRobinWriter(track_generations=True)
    except TypeError:
        pytest.skip("this torchrl has no generation tracking")
    from lightning_per import GPUPrioritizedReplayBuffer
    rb = GPUPrioritizedReplayBuffer(alpha=0.6, beta=0.4, device=device, writer=writer, batch_size=3,
                                    storage=storage_mod.GPUTensorStorage(8, device=device))
    rb.extend(transitions(5))
    assert not rb._direct_sample and "index_generation" in rb.sample().keys()


def test_direct_sample_and_update_hold_the_buffer_locks():
    """The direct sample and update_priority take TorchRL's replay and write locks, as TorchRL's own
    methods do, so a writer thread cannot land a write in the middle of either."""
    import threading

    rb = make_replay_buffer(64, 8, device="cpu", packed=True, generator=torch.Generator().manual_seed(0))
    rb.extend(TensorDict({"observation": torch.randn(32, 3), "reward": torch.randn(32)}, [32]))
    held = []

    class Probe:
        def __init__(self, lock):
            self.lock = lock

        def __enter__(self):
            held.append(True)
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    rb._replay_lock, rb._write_lock = Probe(threading.RLock()), Probe(threading.RLock())
    data = rb.sample()
    assert held == [True, True]
    rb.update_priority(data["index"], torch.ones(8))
    assert held == [True, True, True, True]
