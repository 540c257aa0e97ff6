"""MetricAccumulator semantics against hand-computed values; episode-return ring against a Python model."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_per.metrics import (
    MetricAccumulator,
    new_episode_ring,
    push_episode_returns,
    recent_mean_return,
)


def values(acc: MetricAccumulator) -> dict[str, float]:
    return {k: float(v) for k, v in acc.compute().items()}


def test_reductions_match_hand_computed():
    acc = MetricAccumulator({"m": "mean", "s": "sum", "hi": "max", "lo": "min", "l": "last"})
    for x in (3.0, -1.0, 4.0):
        acc.add("hi", x)
        acc.add("lo", torch.tensor(x))
        acc.add("l", x)
        acc.add("s", x)
    acc.add("m", torch.tensor(6.0), count=torch.tensor(4.0))  # a sum of 4 observations
    acc.add("m", 2.0)  # one more observation
    assert values(acc) == {"m": 8.0 / 5.0, "s": 6.0, "hi": 4.0, "lo": -1.0, "l": 4.0}


def test_empty_window_is_nan_except_sum():
    acc = MetricAccumulator({"m": "mean", "s": "sum", "hi": "max", "lo": "min", "l": "last"})
    v = values(acc)
    assert v["s"] == 0.0
    assert all(math.isnan(v[k]) for k in ("m", "hi", "lo", "l"))


def test_reset_clears_window_but_keeps_persistent():
    acc = MetricAccumulator({"loss": "mean", "env_steps": "sum", "eps": "last"},
                            persistent=("env_steps", "eps"))
    acc.add("loss", 2.0)
    acc.add("env_steps", 10.0)
    acc.add("eps", 0.5)
    acc.reset()
    acc.add("env_steps", 5.0)
    v = values(acc)
    assert math.isnan(v["loss"]) and v["env_steps"] == 15.0 and v["eps"] == 0.5
    acc.reset(clear_persistent=True)
    assert values(acc)["env_steps"] == 0.0 and math.isnan(values(acc)["eps"])


def test_compute_returns_copies_and_stacked_order():
    acc = MetricAccumulator({"a": "sum", "b": "max"})
    acc.add("a", 1.0)
    acc.add("b", 7.0)
    snap = acc.compute()
    names, stacked = acc.compute_stacked()
    acc.reset()
    assert float(snap["a"]) == 1.0  # unaffected by the reset
    assert names == ["a", "b"] and stacked.dtype == torch.float64 and stacked.tolist() == [1.0, 7.0]


def test_state_dict_roundtrip_and_shape_check():
    acc = MetricAccumulator({"a": "mean", "b": "sum"})
    acc.add("a", 3.0)
    acc.add("b", 2.0)
    other = MetricAccumulator({"a": "mean", "b": "sum"})
    other.load_state_dict(acc.state_dict())
    assert values(other) == values(acc)
    with pytest.raises(ValueError, match="shape"):
        MetricAccumulator({"a": "mean"}).load_state_dict(acc.state_dict())


def test_unpickled_copy_owns_its_tensors():
    """torch.multiprocessing (ddp_spawn) pickles CPU tensors into shared memory; each rank must still
    accumulate on its own."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the shared-memory tensor reductions)

    acc = MetricAccumulator({"a": "sum"})
    copy = pickle.loads(ForkingPickler.dumps(acc))
    copy.add("a", 5.0)
    assert float(acc.compute()["a"]) == 0.0 and float(copy.compute()["a"]) == 5.0


def test_bad_inputs():
    with pytest.raises(ValueError, match="reduction"):
        MetricAccumulator({"a": "median"})
    with pytest.raises(ValueError, match="persistent"):
        MetricAccumulator({"a": "sum"}, persistent=("b",))
    with pytest.raises(KeyError, match="not declared"):
        MetricAccumulator({"a": "sum"}).add("b", 1.0)


def test_add_vector_equals_one_add_per_metric():
    names = {"l": "last", "a": "mean", "b": "sum", "c": "mean"}
    one, vec = MetricAccumulator(names), MetricAccumulator(names)
    for x in ([1.0, 2.0, -3.0], [0.5, -1.0, 4.0]):
        for name, v in zip(("a", "b", "c"), x):
            one.add(name, torch.tensor(v))
        vec.add_vector(("a", "b", "c"), torch.tensor(x))  # float32 values, float64 sums
    assert values(vec) == pytest.approx(values(one), nan_ok=True)
    with pytest.raises(ValueError, match="consecutively"):
        vec.add_vector(("a", "c"), torch.zeros(2))
    with pytest.raises(ValueError, match="'mean' or 'sum'"):
        vec.add_vector(("l", "a"), torch.zeros(2))
    with pytest.raises(ValueError, match="shape"):
        vec.add_vector(("a", "b"), torch.zeros(3))
    with pytest.raises(KeyError, match="not declared"):
        vec.add_vector(("z",), torch.zeros(1))


# ------------------------------------------------------------------------------ episode-return ring
def reference_ring(capacity: int, steps: list[list[tuple[float, bool]]]) -> tuple[list[float], int]:
    ring, count = [math.nan] * capacity, 0
    for step in steps:
        for ret, done in step:
            if done:
                ring[count % capacity] = ret
                count += 1
    return ring, count


@settings(max_examples=60, deadline=None)
@given(capacity=st.sampled_from([1, 3, 7, 11]),
       steps=st.lists(st.lists(st.tuples(st.integers(-50, 50).map(float), st.booleans()), min_size=1,
                               max_size=9), min_size=1, max_size=6),
       window=st.integers(1, 12))
def test_episode_ring_matches_python_model(capacity, steps, window):
    n_envs = len(steps[0])
    steps = [(s * n_envs)[:n_envs] for s in steps]  # every step has the same number of envs
    ring, count = new_episode_ring(capacity)
    for step in steps:
        returns, done = torch.tensor([r for r, _ in step]), torch.tensor([d for _, d in step])
        push_episode_returns(ring, count, returns, done)
    ref, ref_count = reference_ring(capacity, steps)
    assert int(count) == ref_count
    assert torch.equal(torch.isnan(ring), torch.tensor([math.isnan(x) for x in ref]))
    assert [x for x in ring.tolist() if not math.isnan(x)] == [x for x in ref if not math.isnan(x)]
    chronological = [r for s in steps for r, d in s if d]
    newest = chronological[-min(window, capacity):] if chronological else []
    got = recent_mean_return(ring, count, window)
    assert (got is None) if not newest else got == pytest.approx(sum(newest) / len(newest))


def test_episode_ring_bad_inputs():
    ring, count = new_episode_ring(4)
    with pytest.raises(ValueError, match="capacity"):
        new_episode_ring(0)
    with pytest.raises(ValueError, match="float32"):
        push_episode_returns(ring.double(), count, torch.zeros(2), torch.zeros(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="int64"):
        push_episode_returns(ring, count.float(), torch.zeros(2), torch.zeros(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="done"):
        push_episode_returns(ring, count, torch.zeros(3), torch.zeros(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="window"):
        recent_mean_return(ring, count, 0)
