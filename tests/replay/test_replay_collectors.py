"""TorchRL's multiprocess collectors write into our buffer (``replay_buffer=rb``): TorchRL shares the buffer and
pickles it into each spawned worker, which receives a ``SharedBufferWriter`` (a writer handle of its own) and
``extend``s through it while the learner samples. Real TorchRL collectors, real ``spawn`` processes, CartPole
through TorchRL's ``GymEnv``; the reference is TorchRL's own shared buffer in the same setting. Each collector test
costs about 40 s on 2 cores (two collector runs, each spawning 2 workers that import torch and torchrl; the
``MultiAsyncCollector`` one is marked slow); the others well under a second."""

from __future__ import annotations

import importlib.metadata
import pickle
from multiprocessing.context import set_spawning_popen

import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import GymEnv

from lightning_per import GPUPrioritizedReplayBuffer, make_replay_buffer
from lightning_per.replay.ingress import SharedBufferWriter

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in importlib.metadata.version("torchrl").split(".")[:2]) < (0, 14),
    reason="checks behaviour against TorchRL >= 0.14's own classes (features older TorchRL lacks)")

_WORKERS, _FRAMES_PER_BATCH, _TOTAL = 2, 64, 640


def _cartpole():
    return GymEnv("CartPole-v1")


def _collect(rb, learner, kind=MultiSyncCollector) -> list[int]:
    """Run a 2-worker collector of ``kind`` writing into ``rb`` for ``_TOTAL`` frames; ``learner(rb)`` after each
    batch; returns ``len(rb)`` after each."""
    collector = kind([_cartpole] * _WORKERS, policy=None, frames_per_batch=_FRAMES_PER_BATCH, total_frames=_TOTAL,
                     replay_buffer=rb)
    lengths = []
    try:
        for data in collector:
            assert data is None  # the batches went into the buffer
            learner(rb)
            lengths.append(len(rb))
    finally:
        collector.shutdown()
    return lengths


def _assert_rows_are_transitions(rows: TensorDict) -> None:
    """A worker's batch is one stretch of its env's trajectory: ``observation[t + 1] == ("next",
    "observation")[t]`` wherever step ``t`` did not end an episode. A row mixing two transitions breaks it."""
    obs, nxt = rows["observation"], rows["next", "observation"]
    cont = ~rows["next", "done"].squeeze(-1)[:-1]
    assert torch.equal(obs[1:][cont], nxt[:-1][cont])
    assert int(cont.sum()) > 0


def test_multisync_collector_fills_our_buffer_like_torchrls_while_the_learner_samples():
    reference = TensorDictReplayBuffer(storage=LazyTensorStorage(10_000))
    _collect(reference, lambda rb: None)

    # TorchRL's sync=False meaning: the workers only write, the learner's one sampler samples
    rb = GPUPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10_000), batch_size=32,
                                    device="cpu", sync=False)
    sampled = []

    def learner(rb):
        batch = rb.sample()  # ingests what the workers made ready, then draws
        batch["td_error"] = batch["next", "reward"].squeeze(-1) + torch.rand(32)
        rb.update_tensordict_priority(batch)
        sampled.append(batch["index"])

    lengths = _collect(rb, learner)
    rb.ingest()
    assert len(rb) == len(reference) == _TOTAL and rb.write_count == reference.write_count == _TOTAL
    assert lengths == sorted(lengths) and lengths[-1] == _TOTAL and lengths[0] < _TOTAL  # sampled while it filled
    assert len(sampled) == _TOTAL // _FRAMES_PER_BATCH
    stats = rb.ingress_stats
    assert (stats.writers, stats.written, stats.ingested, stats.dropped, stats.pending) == (_WORKERS, _TOTAL,
                                                                                           _TOTAL, 0, 0)
    ours, theirs = rb[:_TOTAL], reference[:_TOTAL]
    assert set(ours.exclude("index").keys(True, True)) == set(theirs.exclude("index").keys(True, True))
    per_write = _FRAMES_PER_BATCH // _WORKERS  # one worker's batch: one ring slot, ingested as one block
    for start in range(0, _TOTAL, per_write):
        _assert_rows_are_transitions(ours[start:start + per_write])
    rb.close_writers()


@pytest.mark.slow
def test_multiasync_collector_fills_our_buffer_like_torchrls():
    """The same with ``MultiAsyncCollector`` (workers run free between the learner's reads); about 40 s."""
    reference = TensorDictReplayBuffer(storage=LazyTensorStorage(10_000))
    _collect(reference, lambda rb: None, MultiAsyncCollector)
    rb = make_replay_buffer(10_000, 32, device="cpu")
    lengths = _collect(rb, lambda rb: rb.sample() if len(rb) >= 32 else None, MultiAsyncCollector)
    rb.ingest()
    # the workers run free: one may finish its next batch before the shutdown reaches it, into TorchRL's own buffer
    # as into ours, so each holds the total plus at most one batch per worker, in whole worker batches
    bound = _TOTAL + _WORKERS * _FRAMES_PER_BATCH
    assert _TOTAL <= len(reference) <= bound and len(reference) == reference.write_count
    assert _TOTAL <= len(rb) <= bound and len(rb) % _FRAMES_PER_BATCH == 0 and len(rb) == rb.write_count
    stats = rb.ingress_stats
    assert lengths == sorted(lengths) and stats.written == stats.ingested == len(rb) and stats.dropped == 0
    rb.close_writers()


def _shared(rb):
    rb.share()
    rb.extend(TensorDict({"obs": torch.zeros(2, 3), ("next", "reward"): torch.ones(2, 1)}, [2]))
    return rb


def _as_spawned(rb):
    """``rb`` pickled and unpickled as ``Process.start()`` does for a process being spawned."""
    set_spawning_popen(object())
    try:
        blob = pickle.dumps(rb)
    finally:
        set_spawning_popen(None)
    return pickle.loads(blob)


def test_a_shared_buffer_becomes_a_writer_in_a_process_being_started():
    rb = _shared(make_replay_buffer(100, 2, device="cpu"))
    writer = _as_spawned(rb)
    assert isinstance(writer, SharedBufferWriter) and writer.shared and rb.ingress_stats.writers == 1
    rows = TensorDict({"obs": torch.ones(3, 3), ("next", "reward"): torch.full((3, 1), 7.0),
                       "td_error": torch.tensor([1.0, 2.0, 3.0])}, [3])
    with pytest.raises(ValueError, match="'td_error' that the buffer's layout does not hold"):
        writer.extend(rows)  # a field the buffer does not store: refused, nothing written
    assert writer.extend(rows.exclude("td_error")) == 3 and writer.write_count == 5
    with pytest.raises(RuntimeError, match="writes only"):
        writer.sample()
    assert len(rb) == 5 and torch.equal(rb[2:5]["next", "reward"], torch.full((3, 1), 7.0))
    assert rb.write_count == writer.write_count == 5
    rb.close_writers()


def test_writer_priorities_from_the_priority_key():
    # a batch holding the buffer's priority key sends it as the transitions' raw priorities, as extend would
    rb = _shared(GPUPrioritizedReplayBuffer(alpha=1.0, beta=0.0, eps=1e-8, storage=LazyTensorStorage(8),
                                            device="cpu", priority_key=("next", "reward")))
    writer = _as_spawned(rb)
    writer.extend(TensorDict({"obs": torch.ones(2, 3), ("next", "reward"): torch.tensor([[3.0], [5.0]])}, [2]))
    rb.ingest()
    p = torch.tensor([1.0, 1.0, 3.0, 5.0], dtype=torch.float64) + 1e-8
    torch.testing.assert_close(rb.sampler.probabilities()[:4], p / p.sum(), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="one value per transition"):
        writer.extend(TensorDict({"obs": torch.ones(2, 3), ("next", "reward"): torch.ones(2, 2)}, [2]))
    assert rb.ingest() == 0 and len(rb) == 4
    rb.close_writers()
