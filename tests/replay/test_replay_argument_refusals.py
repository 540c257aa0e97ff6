"""Arguments of the replay buffers that used to be accepted or to fail far from where they were given: each is
refused at construction naming the argument and what was expected, or clamped and counted; nothing stored changes.

Overflow: the expected limits and stored values come from NumPy's float32 of ``(p + eps)**alpha`` (in float64, as
the ops compute it), never from the code under test. Empty writes: TorchRL's own buffer is the oracle.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from lightning_per import (
    GPUPrioritizedSampler,
    GPURandomSampler,
    GPURankBasedSampler,
    GPUSamplerWithoutReplacement,
    GPUTensorStorage,
    cli,
    make_replay_buffer,
)
from lightning_per.replay.priority import raw_limit

F32 = np.finfo(np.float32)
FMAX = float(F32.max)


def _stored(p: float, alpha: float, eps: float) -> np.float32:
    """The stored value of raw priority ``p``, independently: float32 of ``(float64(float32 p) + eps)**alpha`` in
    float64, alpha as the float32 the samplers keep on the device."""
    with np.errstate(over="ignore"):
        return np.float32((np.float64(np.float32(p)) + eps) ** np.float64(np.float32(alpha)))


def _rows(n: int, start: int = 0) -> TensorDict:
    i = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"obs": i.clone(), "episode": (i // 4).long()}, [n])


# ------------------------------------------------------------------------------------------ overflow (item 4)
def test_the_issue_repro_eps_1e65_is_refused_naming_eps_and_its_range():
    with pytest.raises(ValueError, match=r"^eps must be in \(0, 3\.40282e\+38\] with alpha=0\.6, got eps=1e\+65") as e:
        make_replay_buffer(8, 4, eps=1e65, device="cpu")
    assert "FLOAT32_MAX**(1/alpha) - 1" in str(e.value) and "\n" not in str(e.value)
    assert not np.isfinite(_stored(1.0, 0.6, 1e65))  # what it would have stored: inf


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 1.5, 2.0, 7.0, 30.0])
def test_eps_is_accepted_exactly_while_numpy_stores_the_default_priority_finite(alpha):
    with np.errstate(over="ignore"):  # min(FLOAT32_MAX, FLOAT32_MAX**(1/alpha) - 1)
        limit = FMAX if alpha == 0 else min(FMAX, float(np.exp(np.log(FMAX) / alpha)) - 1)
    inside, outside = limit * (1 - 1e-6), min(limit * (1 + 1e-6), 1e300) if limit < FMAX else 3.5e38
    assert np.isfinite(_stored(1.0, alpha, inside))
    assert not np.isfinite(_stored(1.0, alpha, outside)) or outside > FMAX  # past float32 itself
    for sampler in ("proportional", "rank"):
        rb = make_replay_buffer(8, 4, sampler=sampler, alpha=alpha, eps=inside, device="cpu")
        rb.extend(_rows(8))  # every new item gets the default priority 1
        stored = rb.sampler.core.state.leaves.view(-1)[:8].numpy()
        np.testing.assert_allclose(stored, _stored(1.0, alpha, inside), rtol=1e-6)
        assert int(rb.sampler.clamped_priority_count) == 0
        with pytest.raises(ValueError, match=r"^eps must be in \(0, "):
            make_replay_buffer(8, 4, sampler=sampler, alpha=alpha, eps=outside, device="cpu")


@pytest.mark.parametrize("alpha, eps", [(0.6, 1e38), (1.0, 1e-6), (1.0, 1e38), (2.0, 1e-6), (2.0, 1e18),
                                        (7.0, 3e5), (0.999999, 3.4e38)])
def test_raw_limit_is_the_largest_float32_numpy_stores_finite(alpha, eps):
    limit = raw_limit(alpha, eps)
    assert limit >= 1.0 and limit == float(np.float32(limit))
    assert np.isfinite(_stored(limit, alpha, eps))
    above = np.nextafter(np.float32(limit), np.float32(np.inf))
    with np.errstate(over="ignore"):  # the next float32 up exceeds float32's max (or is inf itself)
        assert not np.isfinite(above) or (np.float64(above) + eps) ** np.float64(np.float32(alpha)) > FMAX


@pytest.mark.parametrize("sampler", ["proportional", "rank", "prioritized_slice"])
@pytest.mark.parametrize("alpha, eps", [(0.6, 1e38), (1.0, 1e38), (2.0, 1e-6), (2.0, 1e18), (7.0, 3e5)])
def test_huge_priorities_are_clamped_counted_and_stored_as_numpy_computes(sampler, alpha, eps):
    extra = dict(slice_len=1, traj_key="episode") if sampler == "prioritized_slice" else {}
    rb = make_replay_buffer(16, 4, sampler=sampler, alpha=alpha, eps=eps, device="cpu",
                            generator=torch.Generator().manual_seed(0), **extra)
    rb.extend(_rows(16))
    raw = [0.0, 1.0, 3.0, 1e5, 1e10, 1e19, 1e30, 3e38, FMAX, float("inf"), float("nan"), -1.0, 2.0, 0.5, 7.0, 1e3]
    rb.update_priority(torch.arange(16), torch.tensor(raw))
    stored = rb.sampler.core.state.leaves.view(-1)[:16].numpy()
    assert np.isfinite(stored).all() and np.isfinite(rb.sampler.core.state.block_sum.numpy()).all()
    finite = [i for i, p in enumerate(raw) if np.isfinite(p) and p >= 0]
    overflow = [i for i in finite if not np.isfinite(_stored(raw[i], alpha, eps))]
    fits = [i for i in finite if i not in overflow]
    np.testing.assert_allclose(stored[fits], [_stored(raw[i], alpha, eps) for i in fits], rtol=1e-6)
    # clamped: the overflowing finite ones, and inf, nan, -1 (the sanitizing rule); the overflowing ones store a
    # value near float32's max, still the largest
    assert int(rb.sampler.clamped_priority_count) == len(overflow) + 3
    assert all(stored[i] >= stored[fits].max() for i in overflow)
    for _ in range(5):  # IndexError here before (an inf block sum)
        batch = rb.sample()
        assert batch["index"].min() >= 0 and batch["index"].max() < 16
        assert torch.isfinite(batch["priority_weight"]).all()


def test_alpha_that_overflows_the_default_priority_is_refused_naming_alpha_and_changes_nothing():
    rb = make_replay_buffer(8, 4, alpha=0.5, eps=1.0, device="cpu")
    rb.extend(_rows(8))
    before = rb.sampler.core.state.leaves.clone()
    assert not np.isfinite(_stored(1.0, 200.0, 1.0)) and np.isfinite(_stored(1.0, 100.0, 1.0))
    with pytest.raises(ValueError, match=r"^alpha must be <= 128 with eps=1\.0, got alpha=200\.0"):
        rb.sampler.alpha = 200.0
    assert rb.sampler.alpha == 0.5
    torch.testing.assert_close(rb.sampler.core.state.leaves, before, rtol=0, atol=0)
    rb.sampler.alpha = 100.0  # (1 + 1)^100 = 1.3e30: finite
    np.testing.assert_allclose(rb.sampler.core.state.leaves.view(-1)[:8].numpy(), _stored(1.0, 100.0, 1.0), rtol=1e-6)
    # at construction the pair is refused naming eps, with its limit FLOAT32_MAX**(1/200) - 1
    limit = np.exp(np.log(FMAX) / 200) - 1
    with pytest.raises(ValueError, match=rf"^eps must be in \(0, {limit:.6g}\] with alpha=200\.0, got eps=1\.0"):
        GPUPrioritizedSampler(8, alpha=200.0, beta=0.4, eps=1.0, device="cpu")


@pytest.mark.parametrize("cls", [GPUPrioritizedSampler, GPURankBasedSampler])
def test_the_samplers_refuse_an_overflowing_eps_themselves(cls):
    with pytest.raises(ValueError, match=r"^eps must be in \(0, 1\.84467e\+19\] with alpha=2\.0"):
        cls(8, alpha=2.0, beta=0.4, eps=1e20, device="cpu")
    with pytest.raises(ValueError, match=r"^eps must be a finite number > 0, got True"):
        cls(8, alpha=2.0, beta=0.4, eps=True, device="cpu")


def test_fit_refuses_an_overflowing_replay_eps_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    (tmp_path / "summary.json").write_text('{"status": "done"}')
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml"),
                  f"--trainer.default_root_dir={tmp_path}", "--model.replay.eps=1e300"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("error: replay.eps must be in (0, 3.40282e+38] with alpha=0.6, got replay.eps=1e+300")
    assert (tmp_path / "summary.json").read_text() == '{"status": "done"}'  # nothing of the run written
    assert not (tmp_path / "config.yaml").exists()


# ------------------------------------------------------------------------------------------ arguments (item 7)
_SLICE = dict(sampler="slice", slice_len=2)
_PSLICE = dict(sampler="prioritized_slice", slice_len=2)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(packed="no"), TypeError, "packed must be a bool (True or False), got str 'no'"),
    (dict(packed=1), TypeError, "packed must be a bool (True or False), got int 1"),
    (dict(fallback="no"), TypeError, "fallback must be a bool"),
    (dict(pinned_host="no"), TypeError, "pinned_host must be a bool"),
    (dict(stratified="yes"), TypeError, "stratified must be a bool (True or False), got str 'yes'"),
    (dict(shuffle_strata=2), TypeError, "shuffle_strata must be a bool (True or False), got int 2"),
    (dict(eager_graphs="no"), TypeError, "eager_graphs must be a bool"),
    (dict(sampler="uniform", eager_graphs="no"), TypeError, "eager_graphs must be a bool"),
    (dict(max_priority_within_buffer="yes"), TypeError, "max_priority_within_buffer must be a bool"),
    (dict(sampler="rank", sort_every=True), ValueError, "sort_every must be an int >= 1, got True"),
    (dict(_SLICE, strict_length="no"), TypeError, "strict_length must be a bool (True or False), got str 'no'"),
    (dict(_PSLICE, strict_length=0), TypeError, "strict_length must be a bool (True or False), got int 0"),
    (dict(_SLICE, end_key=5), TypeError, "end_key must be a key of the stored TensorDict (a str or a non-empty "
                                         "tuple of str, or None), got int 5"),
    (dict(_PSLICE, end_key=("next", 5)), TypeError, "end_key must be a key of the stored TensorDict"),
    (dict(_SLICE, traj_key=5), TypeError, "traj_key must be a key"),
    (dict(_SLICE, truncated_key=1.0), TypeError, "truncated_key must be a key"),
    (dict(_SLICE, init_key=()), TypeError, "init_key must be a key"),
    (dict(_SLICE, end_keys="done"), TypeError, "end_keys must be a list or tuple of keys"),
    (dict(_SLICE, end_keys=["done", 3]), TypeError, "end_keys[1] must be a key of the stored TensorDict"),
    (dict(frames=10), ValueError, "frames configures the frame ring of a frame_stack buffer: give frame_stack"),
    (dict(frame_keys=("obs", "next_obs")), ValueError, "frame_keys configures the frame ring of a frame_stack"),
    (dict(capacity=2**62), ValueError, "capacity must be an int in [1, 2**45], got 4611686018427387904"),
    (dict(sampler="uniform", capacity=2**62), ValueError, "capacity must be an int in [1, 2**45]"),
    (dict(_SLICE, capacity=2**62), ValueError, "capacity must be an int in [1, 2**45]"),
    (dict(seed=2**70), ValueError, "seed must be None or an int in [-2**63, 2**64) (torch.Generator.manual_seed's "
                                   "range), got 1180591620717411303424"),
    (dict(sampler="uniform", seed=2**70), ValueError, "seed must be None or an int in [-2**63, 2**64)"),
    (dict(_SLICE, seed=-2**64), ValueError, "seed must be None or an int in [-2**63, 2**64)"),
    (dict(device="meta"), ValueError, "device must be 'cpu' or a CUDA device ('cuda', 'cuda:1'), or None; got "
                                      "'meta'"),
    (dict(sampler="uniform", device="meta"), ValueError, "device must be 'cpu' or a CUDA device"),
    # TorchRL's reductions of an item's priorities (torchrl.data.replay_buffers.utils._reduce): its own only
    (dict(reduction="bogus"), ValueError, "reduction must be one of ['max', 'min', 'mean', 'median', 'sum'], got "
                                          "'bogus'"),
    (dict(sampler="rank", reduction="avg"), ValueError, "reduction must be one of"),
    (dict(_PSLICE, reduction="avg"), ValueError, "reduction must be one of"),
])
def test_make_replay_buffer_refuses_naming_the_argument(kwargs, error, message):
    kwargs = dict(kwargs)
    capacity = kwargs.pop("capacity", 16)
    kwargs.setdefault("device", "cpu")
    with pytest.raises(error) as info:
        make_replay_buffer(capacity, 4, **kwargs)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize("build, error, message", [
    (lambda: GPUTensorStorage(2**62, device="cpu"), ValueError, "max_size must be an int in [1, 2**45]"),
    (lambda: GPUTensorStorage(8, device="cpu", packed="no"), TypeError, "packed must be a bool"),
    (lambda: GPUTensorStorage(8, device="meta"), ValueError, "device must be 'cpu' or a CUDA device"),
    (lambda: GPUPrioritizedSampler(2**62, 0.6, 0.4, device="cpu"), ValueError, "max_capacity must be an int in"),
    (lambda: GPUPrioritizedSampler(8, 0.6, 0.4, device="cpu", stratified="yes"), TypeError, "stratified must be"),
    (lambda: GPURandomSampler(device="cpu", seed=2**70), ValueError, "seed must be None or an int in"),
    (lambda: GPUSamplerWithoutReplacement(device="cpu", seed=2**70), ValueError, "seed must be None or an int in"),
    (lambda: GPUSamplerWithoutReplacement(device="cpu", seed="1"), TypeError, "seed must be None or an int"),
])
def test_the_classes_refuse_naming_the_argument(build, error, message):
    with pytest.raises(error) as info:
        build()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("seed", [2**70, -2**64, "3", 1.5, True])
def test_manual_seed_out_of_range_is_refused_and_changes_nothing(seed):
    sampler = GPUPrioritizedSampler(8, 0.6, 0.4, device="cpu", seed=7)
    before = sampler.generator.get_state()
    with pytest.raises((TypeError, ValueError), match="^seed must be None or an int"):
        sampler.manual_seed(seed)
    assert torch.equal(sampler.generator.get_state(), before)


def test_real_bools_and_keys_are_still_accepted():
    rb = make_replay_buffer(16, 4, device="cpu", packed=True, fallback=False, stratified=False,
                            shuffle_strata=False, eager_graphs=False, seed=2**64 - 1)
    assert rb.storage.packed is True and rb.sampler.core.rule.stratified is False
    rb = make_replay_buffer(16, 4, sampler="slice", slice_len=2, strict_length=False, end_key=("next", "done"),
                            traj_key="episode", device="cpu", seed=-2**63)
    assert rb.sampler.strict_length is False


# ------------------------------------------------------------------------------------------ empty writes (item 7)
_KINDS = ["uniform", "proportional", "rank", "slice", "prioritized_slice", "frame_stack"]


def _buffer(kind: str):
    kw = dict(device="cpu", seed=0)
    if kind in ("slice", "prioritized_slice"):
        kw.update(slice_len=2, traj_key="episode")
    if kind == "frame_stack":
        kw.update(frame_stack=2, frames=200)
    return make_replay_buffer(16, 4, sampler="proportional" if kind == "frame_stack" else kind, **kw)


def _batch(kind: str, n: int, start: int = 0) -> TensorDict:
    td = _rows(n, start)
    if kind == "frame_stack":
        frames = torch.arange(start, start + n + 1, dtype=torch.uint8)[:, None].expand(n + 1, 3)
        td["observation"] = torch.stack([frames[:n], frames[:n]], 1)
        td["next_observation"] = torch.stack([frames[1:], frames[1:]], 1)
    return td


def _snapshot(rb) -> dict:
    state = copy.deepcopy(rb.state_dict())
    state.pop("_rng", None)
    return state


def _same(a, b) -> bool:
    """``a`` and ``b`` (nested dicts, lists, tensors, TensorDicts, plain values) hold equal values."""
    if isinstance(a, dict) or hasattr(a, "items"):
        return set(a.keys()) == set(b.keys()) and all(_same(a[k], b[k]) for k in a.keys())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(
            ((a == b) | (a.isnan() & b.isnan()) if a.is_floating_point() else a == b).all())
    return a == b


@pytest.mark.parametrize("kind", _KINDS)
def test_extending_with_no_item_is_a_no_op_as_in_torchrl(kind):
    oracle = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
    oracle.extend(_batch(kind, 5))
    want = oracle.extend(_batch(kind, 0))  # TorchRL: an empty int64 index, nothing written
    assert len(oracle) == 5

    rb = _buffer(kind)
    got = rb.extend(_batch(kind, 0))  # a fresh buffer (TorchRL's raises an IndexError there)
    assert got.dtype == want.dtype and got.shape == want.shape == (0,) and len(rb) == 0
    assert not rb.storage.initialized
    rb.extend(_batch(kind, 5))
    before = _snapshot(rb)
    got = rb.extend(_batch(kind, 0))
    assert got.dtype == want.dtype and got.shape == want.shape and got.device == want.device
    assert len(rb) == len(oracle) == 5
    assert _same(_snapshot(rb), before)
    assert rb.storage.get(torch.arange(5))["obs"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert rb.extend(_batch(kind, 3, 5)).tolist() == [5, 6, 7]  # the cursor did not move


@pytest.mark.parametrize("kind", ["proportional", "frame_stack"])
def test_an_empty_batch_of_another_spec_is_still_refused(kind):
    rb = _buffer(kind)
    rb.extend(_batch(kind, 5))
    bad = _batch(kind, 0)
    bad["obs"] = torch.zeros(0, 7)
    with pytest.raises(ValueError, match="obs"):
        rb.extend(bad)
    assert len(rb) == 5


@pytest.mark.parametrize("sampler", ["proportional", "rank", "uniform"])
@pytest.mark.parametrize("batch_size", [0, -3, 2.0])
def test_a_bad_sample_batch_size_is_one_error_and_no_warning(sampler, batch_size):
    import warnings

    rb = make_replay_buffer(64, 8, sampler=sampler, device="cpu")
    rb.extend(TensorDict({"x": torch.arange(16.0)[:, None]}, [16]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the batch-size-differs warning must not come first
        with pytest.raises(ValueError, match=f"batch_size must be an int >= 1, got {batch_size!r}"):
            rb.sample(batch_size)


@pytest.mark.parametrize("kwargs", [dict(sampler="proportional"), dict(sampler="rank"), dict(sampler="uniform"),
                                    _SLICE, _PSLICE])
def test_a_given_generator_draws_and_a_seed_beside_it_changes_nothing(kwargs):
    """make_replay_buffer's documented precedence: the buffer's generator draws every sample (TorchRL's set_rng), so the
    draws of two buffers with one generator seed are equal whatever the sampler's seed, and a second generator seed
    changes them."""
    from tensordict import TensorDict

    def draws(seed, generator_seed):
        rb = make_replay_buffer(64, 8, device="cpu", seed=seed,
                                generator=torch.Generator().manual_seed(generator_seed), **kwargs)
        episode = torch.arange(64) // 8  # 8 trajectories of 8 steps (the slice samplers' episode key)
        rb.extend(TensorDict({"x": torch.arange(64.0), "episode": episode}, batch_size=[64]))
        return torch.cat([rb.sample()["x"] for _ in range(3)])

    assert torch.equal(draws(0, 1), draws(5, 1))
    assert not torch.equal(draws(0, 1), draws(0, 2))
