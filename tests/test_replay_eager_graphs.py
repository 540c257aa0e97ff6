"""CPU checks of the cached-graph plumbing (the graphs themselves run in tests/test_replay_eager_graphs_gpu.py):
outputs packed into one flat buffer come back with their values, dtypes and shapes, as fresh tensors."""

from __future__ import annotations

import pytest
import torch

from lightning_per.replay._eager_graphs import _Entry, _pack


class _NoGraph:
    def replay(self):
        pass


def test_packed_outputs_come_back_equal_and_fresh():
    g = torch.Generator().manual_seed(0)
    outputs = (torch.randint(-2**62, 2**62, (3, 5), generator=g), torch.arange(3), torch.rand(3, generator=g),
               torch.rand(2, 2, generator=g) > 0.5, torch.tensor(2.5, dtype=torch.float64),
               torch.randint(0, 100, (7,), generator=g, dtype=torch.int16), torch.rand(5, generator=g).half())
    flat, layout = _pack(outputs)
    entry = _Entry(_NoGraph(), (), flat, layout, ())
    first, second = entry(()), entry(())
    for want, got in zip(outputs, first):
        assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
        assert torch.equal(got, want)
    first[0].zero_()  # the caller owns its outputs: the next call's are untouched
    assert torch.equal(second[0], outputs[0])


def test_wide_elements_are_refused():
    with pytest.raises(TypeError, match="1 to 8 bytes"):
        _pack((torch.zeros(2, dtype=torch.complex128),))
