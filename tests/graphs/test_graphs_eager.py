"""CPU checks of the cached-graph plumbing (the graphs themselves run in tests/graphs/test_graphs_eager_gpu.py):
outputs packed into flat buffers come back with their values, dtypes and shapes, as fresh tensors that
torch.save accepts; a call shape whose capture fails runs eagerly from then on."""

from __future__ import annotations

import io

import pytest
import torch

from lightning_per.graphs.eager import EagerGraphs, _Entry, _pack


class _NoGraph:
    def replay(self):
        pass


def _outputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randint(-2**62, 2**62, (3, 5), generator=g), torch.arange(3), torch.rand(3, generator=g),
            torch.rand(2, 2, generator=g) > 0.5, torch.tensor(2.5, dtype=torch.float64),
            torch.randint(0, 100, (7,), generator=g, dtype=torch.int16), torch.rand(5, generator=g).half(),
            torch.randn(2, dtype=torch.complex128, generator=g))


def test_packed_outputs_come_back_equal_and_fresh():
    outputs = _outputs()
    flats, layout = _pack(outputs)
    entry = _Entry(_NoGraph(), (), flats, layout, ())
    first, second = entry(()), entry(())
    for want, got in zip(outputs, first):
        assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
        assert torch.equal(got, want)
    assert first[0].storage_offset() == 0  # the first output starts its buffer (a gathered block's views need it)
    first[0].zero_()  # the caller owns its outputs: the next call's are untouched
    assert torch.equal(second[0], outputs[0])


def test_outputs_of_different_dtypes_share_no_storage_and_save():
    first = _Entry(_NoGraph(), (), *_pack(_outputs()), ())(())
    pointers = {t.dtype: t.untyped_storage().data_ptr() for t in first}
    assert len(set(pointers.values())) == len(pointers)  # one allocation per dtype
    buffer = io.BytesIO()
    torch.save({"index": first[1], "priority_weight": first[2]}, buffer)  # as a sampled batch's two keys
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert torch.equal(loaded["index"], first[1]) and torch.equal(loaded["priority_weight"], first[2])


def test_a_failed_capture_runs_eagerly_from_then_on(monkeypatch):
    graphs = EagerGraphs()
    attempts = []

    def fail(*args, **kwargs):
        attempts.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "_capture", fail)
    calls = []

    def fn(x):
        calls.append(1)
        return (x + 1,)

    x = torch.arange(4)
    assert torch.equal(graphs.run("k", fn, (x,))[0], x + 1)  # first call: eager
    with pytest.warns(RuntimeWarning, match="could not capture"):
        assert torch.equal(graphs.run("k", fn, (x,))[0], x + 1)  # the capture fails: eager, one warning
    assert torch.equal(graphs.run("k", fn, (x,))[0], x + 1)  # no second attempt
    assert len(attempts) == 1 and len(calls) == 3 and len(graphs) == 0


def test_paused_eager_graphs_neither_record_nor_replay(monkeypatch):
    """Inside ``eager_graphs_paused`` (what ``warm_up_on_side_stream`` runs its warm-up in, before an outer
    capture) calls are not served by cached graphs, in this thread only."""
    import threading

    from lightning_per.graphs.eager import eager_graphs_are_paused, eager_graphs_paused

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert EagerGraphs.active()
    with eager_graphs_paused():
        assert not EagerGraphs.active()
        with eager_graphs_paused():  # nested
            assert eager_graphs_are_paused()
        assert not EagerGraphs.active()
        seen = []
        other = threading.Thread(target=lambda: seen.append(EagerGraphs.active()))
        other.start()
        other.join()
        assert seen == [True]  # another thread (a GA3C predictor) is not paused
    assert EagerGraphs.active()
