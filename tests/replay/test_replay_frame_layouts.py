"""FrameStackStorage finds TorchRL's nested ``("next", "observation")`` layout (what TorchRL's collectors write)
without being told, keeps it through a checkpoint, and its refusals name the fix. The rebuilt stacks are checked
against the stacks written (an independent copy). CPU only; about 2 s."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from lightning_per import FrameStackStorage, make_replay_buffer

S = 4


def stacked(n: int, nested: bool, key: str = "observation", frame=(6, 6)) -> TensorDict:
    """``n`` transitions of one env's stack of ``S`` frames: frame ``t`` is filled with ``t``; observation ``t`` holds
    frames ``t .. t + S - 1``, the next observation frames ``t + 1 .. t + S``."""
    frames = torch.arange(n + S, dtype=torch.uint8).view(-1, 1, 1).expand(-1, *frame)
    obs = torch.stack([frames[t:t + S] for t in range(n)])
    nxt = torch.stack([frames[t + 1:t + 1 + S] for t in range(n)])
    td = TensorDict({key: obs, "action": torch.arange(n), "reward": torch.ones(n)}, [n])
    if nested:
        td["next"] = TensorDict({key: nxt, "done": torch.zeros(n, 1, dtype=torch.bool)}, [n])
    else:
        td["next_" + key] = nxt
    return td


@pytest.mark.parametrize("nested, key, want", [
    (False, "observation", ("observation", "next_observation")),
    (True, "observation", ("observation", ("next", "observation"))),
    (True, "pixels", ("pixels", ("next", "pixels")))])
def test_layout_found_at_first_write(nested, key, want):
    rb = make_replay_buffer(64, 8, device="cpu", frame_stack=S, frames=512, seed=0)
    data = stacked(20, nested, key)
    rb.extend(data)
    storage = rb.storage
    assert storage.frame_keys == want
    assert int(storage.frames_written) == 20 + S  # each distinct frame once, in either layout
    batch = rb.sample()
    index = batch["index"]
    for k in want:
        assert torch.equal(batch[k], data[k][index]), k
    assert torch.equal(batch[("next", "done")], data[("next", "done")][index]) if nested else True


def test_nested_layout_survives_a_checkpoint():
    a = FrameStackStorage(32, frame_stack=S, frames=512, device="cpu")
    a.set(torch.arange(10), stacked(10, True))
    b = FrameStackStorage(32, frame_stack=S, frames=512, device="cpu")
    b.load_state_dict(a.state_dict())
    assert b.frame_keys == ("observation", ("next", "observation"))
    want = stacked(10, True)
    assert torch.equal(b.get(torch.arange(10))[("next", "observation")], want[("next", "observation")])
    flat = FrameStackStorage(32, frame_stack=S, frames=512, device="cpu", keys=("observation", "next_observation"))
    with pytest.raises(ValueError, match="saved storage stacks the keys"):
        flat.load_state_dict(a.state_dict())


def test_flat_keys_on_nested_data_name_the_fix():
    s = FrameStackStorage(32, frame_stack=S, frames=512, device="cpu", keys=("observation", "next_observation"))
    with pytest.raises(ValueError, match=r"pass keys=\('observation', \('next', 'observation'\)\)"):
        s.set(torch.arange(4), stacked(4, True))
    assert s.frames is None  # nothing stored


def test_unknown_layout_names_the_keyword():
    s = FrameStackStorage(32, frame_stack=S, frames=512, device="cpu")
    with pytest.raises(ValueError, match=r"keys=\(obs_key, next_obs_key\)"):
        s.set(torch.arange(4), stacked(4, False, key="screen"))
    assert s.frames is None and s.frame_keys is None


def test_oversized_extend_says_the_fix():
    """A capacity-1000 buffer of 4-frame stacks and one extend of 200 transitions: the error gives the largest batch
    and the ``frames=`` that fit, and following either advice works."""
    rb = make_replay_buffer(1000, 32, device="cpu", frame_stack=S, seed=0)
    data = stacked(200, True, frame=(2, 2))
    with pytest.raises(ValueError, match=r"extend in batches of at most (\d+) transitions.*frames >= 2624") as err:
        rb.extend(data)
    assert len(rb) == 0
    most = int(err.value.args[0].split("at most ")[1].split()[0])
    assert most == (1000 + 1000 // 64) // (2 * S)  # (frames - window) // (2 S), window 1024 of the default ring
    for start in range(0, 200, most):
        rb.extend(data[start:start + most])
    assert len(rb) == 200
    big = make_replay_buffer(1000, 32, device="cpu", frame_stack=S, frames=2624, seed=0)
    big.extend(data)
    assert len(big) == 200
