"""The sample-to-insert ratio limit (``samples_per_insert``): TorchRL 0.15's ``RateLimitedReplayBuffer`` semantics
(cumulative: at most ``floor(write_count * ratio)`` records sampled in all), checked against that closed form, with
a real writer thread waking a waiting ``sample(wait=True)``. CPU, about a second."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from tensordict import TensorDict

from lightning_per import make_replay_buffer


def _rows(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n, dtype=torch.float32)}, [n])


@pytest.mark.parametrize("sampler", ["proportional", "rank", "uniform"])
def test_budget_is_cumulative_writes_times_the_ratio(sampler):
    ratio, batch = 0.75, 3
    rb = make_replay_buffer(10, batch, device="cpu", sampler=sampler, samples_per_insert=ratio)
    sampled = 0
    for written in (4, 8, 12, 16, 20):  # the ring of 10 wraps at 10: the budget follows writes, not occupancy
        rb.extend(_rows(4, written))
        while math.floor(written * ratio) - sampled >= batch:
            rb.sample()
            sampled += batch
        with pytest.raises(RuntimeError, match="pass wait=True"):
            rb.sample()
        assert rb.rate_limit.sampled == sampled and rb.write_count == written
    assert sampled == 15 and len(rb) == 10


def test_wait_ingests_a_writers_batches_until_permitted():
    rb = make_replay_buffer(100, 4, device="cpu", samples_per_insert=1.0)
    handle = rb.writer_handle(_rows(1), slots=2, rows=8)
    rb.extend(_rows(4))
    rb.sample()  # the budget is spent: 4 written, 4 sampled
    started = threading.Event()

    def writer():
        started.wait()
        handle.write(_rows(4, 100))  # a real write through the shared-memory ring

    thread = threading.Thread(target=writer)
    thread.start()
    with pytest.raises(RuntimeError, match="permits 0 more records, not 4"):
        rb.sample()
    started.set()
    batch = rb.sample(wait=True, timeout=60.0)  # ingests the writer's rows, then samples
    thread.join()
    assert batch.batch_size == (4,) and rb.write_count == 8 and rb.rate_limit.waits in (0, 1)
    assert rb.rate_limit.sampled == 8
    with pytest.raises(TimeoutError, match="within 0.01 s"):
        rb.sample(wait=True, timeout=0.01)
    assert rb.rate_limit.waits >= 1
    rb.close_writers()


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (-1.0, ValueError), (math.inf, ValueError),
                                              (math.nan, ValueError), (True, TypeError), ("1", TypeError)])
def test_bad_ratio_is_refused(value, error):
    with pytest.raises(error, match="samples_per_insert must be a finite number > 0"):
        make_replay_buffer(10, 2, device="cpu", samples_per_insert=value)


def test_bad_timeout_is_refused_and_counts_nothing():
    rb = make_replay_buffer(10, 2, device="cpu", samples_per_insert=1.0)
    rb.extend(_rows(4))
    with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
        rb.sample(wait=True, timeout=-1)
    assert rb.rate_limit.sampled == 0
