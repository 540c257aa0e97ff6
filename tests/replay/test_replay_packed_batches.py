"""Batches read from a packed ring behave like tensors: ``torch.save`` of the batch and ``.view`` of a field work,
and the values are those of an unpacked buffer drawing with the same seed. CPU only; about 2 s."""

import io

import pytest
import torch
from tensordict import TensorDict

from lightning_per import make_replay_buffer


def transitions(n: int) -> TensorDict:
    g = torch.Generator().manual_seed(3)
    return TensorDict({"observation": torch.randn(n, 2, 3, generator=g),
                       "action": torch.randint(0, 4, (n,), generator=g), "reward": torch.randn(n, generator=g),
                       "done": torch.rand(n, 1, generator=g) < 0.1,
                       ("next", "observation"): torch.randn(n, 2, 3, generator=g)}, [n])


@pytest.mark.parametrize("sampler", ["proportional", "uniform"])
def test_packed_batch_saves_and_views_like_unpacked(sampler):
    packed = make_replay_buffer(64, 16, sampler=sampler, device="cpu", packed=True, seed=5)
    plain = make_replay_buffer(64, 16, sampler=sampler, device="cpu", packed=False, seed=5)
    for rb in (packed, plain):
        rb.extend(transitions(40))
    batch, want = packed.sample(), plain.sample()
    buffer = io.BytesIO()
    torch.save(batch, buffer)  # torch refused this when fields were views of one block as several dtypes
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)  # the bytes this test just wrote
    for key in want.keys(include_nested=True, leaves_only=True):
        assert torch.equal(batch[key], want[key]), key
        assert torch.equal(loaded[key], want[key]), key
        assert batch[key].view(-1).shape == (want[key].numel(),), key
    assert batch.view(4, 4)["observation"].shape == (4, 4, 2, 3)
