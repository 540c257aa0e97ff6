"""from_torchrl: a TorchRL buffer's dumps directory or state_dict becomes ours with the same items in the same slots,
the same writer cursor and count, and (prioritized) the draw probabilities of TorchRL's own sum tree (chi-square over
our draws) and the IS weights TorchRL's own buffer returns for the same slots. Nothing is unpickled: a booby-trapped
prefetch.pkl stays unopened, other files and links are refused. CPU only; about 6 s."""

from __future__ import annotations

import importlib.metadata
import os
import pickle

import numpy as np
import pytest
import torch
from scipy import stats
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictPrioritizedReplayBuffer, TensorDictReplayBuffer

from lightning_per import (
    GPUPrioritizedReplayBuffer,
    GPUPrioritizedSliceSampler,
    GPURandomSampler,
    GPUReplayBuffer,
    from_torchrl,
)
from lightning_per.integrity import IntegrityError

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in importlib.metadata.version("torchrl").split(".")[:2]) < (0, 14),
    reason="checks behaviour against TorchRL >= 0.14's own classes (features older TorchRL lacks)")

CAP = 16


def items(n: int, start: int = 0) -> TensorDict:
    t = torch.arange(start, start + n)
    return TensorDict({"observation": t.float().unsqueeze(1).expand(n, 3).clone(), "action": t % 4,
                       "done": (t % 5 == 0).unsqueeze(1), "episode": t // 6,
                       ("next", "observation"): (t + 1).float().unsqueeze(1).expand(n, 3).clone()}, [n])


def torchrl_prioritized(storage_cls=LazyTensorStorage) -> TensorDictPrioritizedReplayBuffer:
    """TorchRL's buffer after 23 writes into 16 slots (cursor 7), with priorities 1..16 and a running max (50) that
    no stored item holds any more."""
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, eps=1e-6, storage=storage_cls(CAP), batch_size=32)
    rb.extend(items(CAP))
    rb.update_priority(torch.tensor([3]), torch.tensor([50.0]))
    rb.extend(items(7, CAP))  # slots 0..6, slot 3 overwritten; new items at the running max
    rb.update_priority(torch.arange(CAP), torch.arange(1.0, CAP + 1.0))
    return rb


def tree_probabilities(rb) -> np.ndarray:
    """TorchRL's P(i) = v_i / sum_k v_k from its own sum tree."""
    leaves = rb.state_dict()["_sampler"]["_sum_tree"][torch.arange(CAP)].double().numpy()
    return leaves / leaves.sum()


def check_same_buffer(ours, theirs) -> None:
    assert len(ours) == len(theirs) == CAP
    assert ours.writer.state_dict() == {"_cursor": 7, "_write_count": 23} == theirs.writer.state_dict()
    want = theirs.storage[torch.arange(CAP)].exclude("index")
    got = ours.storage[torch.arange(CAP)]
    assert set(got.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(True, True):
        assert torch.equal(got[key], want[key]), key


def check_same_draws(ours: GPUPrioritizedReplayBuffer, theirs) -> None:
    assert float(ours.sampler.default_priority) == pytest.approx(float(theirs.sampler.default_priority)) == 50.0
    # IS weights: TorchRL's own buffer's weight of each slot it draws, against ours for the same slot
    want = {}
    for _ in range(40):
        batch = theirs.sample()
        want.update(zip(batch["index"].tolist(), batch["priority_weight"].tolist()))
    got = {}
    counts = np.zeros(CAP)
    for _ in range(300):
        batch = ours.sample()
        got.update(zip(batch["index"].tolist(), batch["priority_weight"].tolist()))
        counts += np.bincount(batch["index"].numpy(), minlength=CAP)
    shared = sorted(set(want) & set(got))
    assert len(shared) >= CAP // 2
    np.testing.assert_allclose([got[i] for i in shared], [want[i] for i in shared], rtol=1e-5)
    # draw probabilities: our 9600 draws against TorchRL's tree (stratified draws only make the fit closer)
    expected = tree_probabilities(theirs) * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage])
def test_a_prioritized_dumps_directory_migrates(tmp_path, storage_cls):
    theirs = torchrl_prioritized(storage_cls)
    theirs.dumps(tmp_path / "rb")
    ours = from_torchrl(tmp_path / "rb", device="cpu", generator=torch.Generator().manual_seed(0))
    assert type(ours) is GPUPrioritizedReplayBuffer and ours.batch_size == 32
    assert (ours.sampler.alpha, ours.sampler.beta) == (0.7, 0.5)
    check_same_buffer(ours, theirs)
    check_same_draws(ours, theirs)


def test_a_prioritized_state_dict_migrates():
    theirs = torchrl_prioritized()
    ours = from_torchrl(theirs.state_dict(), device="cpu", generator=torch.Generator().manual_seed(1))
    check_same_buffer(ours, theirs)
    check_same_draws(ours, theirs)


@pytest.mark.parametrize("via", ["dumps", "state_dict"])
def test_a_uniform_buffer_migrates(tmp_path, via):
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(CAP), batch_size=8)
    theirs.extend(items(23))
    if via == "dumps":
        theirs.dumps(tmp_path / "rb")
    ours = from_torchrl(tmp_path / "rb" if via == "dumps" else theirs.state_dict(), device="cpu")
    assert type(ours) is GPUReplayBuffer and isinstance(ours.sampler, GPURandomSampler)
    check_same_buffer(ours, theirs)
    assert ours.sample().batch_size == (8,)


def test_a_slice_sampler_can_be_named(tmp_path):
    """TorchRL saves no slice settings: the sampler to use is given, and must agree with the saved exponents."""
    theirs = torchrl_prioritized()
    theirs.dumps(tmp_path / "rb")
    sampler = GPUPrioritizedSliceSampler(CAP, 0.7, 0.5, 1e-6, slice_len=2, traj_key="episode", device="cpu")
    ours = from_torchrl(tmp_path / "rb", sampler=sampler, batch_size=8)
    assert ours.sampler is sampler and ours.sample().batch_size == (8,)
    with pytest.raises(ValueError, match=r"alpha=0.7 differs from the sampler's alpha=0.6"):
        from_torchrl(tmp_path / "rb", sampler=GPUPrioritizedSliceSampler(CAP, 0.6, 0.5, 1e-6, slice_len=2,
                                                                         traj_key="episode", device="cpu"))


class _Trap:
    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_nothing_is_unpickled_and_other_files_are_refused(tmp_path):
    theirs = torchrl_prioritized()
    root = tmp_path / "rb"
    theirs.dumps(root)
    trap = _Trap()
    trap.marker = str(tmp_path / "unpickled")
    (root / "prefetch.pkl").write_bytes(pickle.dumps(trap))
    from_torchrl(root, device="cpu")
    assert not (tmp_path / "unpickled").exists()
    (root / "storage" / "evil.pkl").write_bytes(pickle.dumps(trap))
    with pytest.raises(ValueError, match=r"'storage/evil.pkl' is not part of a TorchRL replay dump"):
        from_torchrl(root, device="cpu")
    (root / "storage" / "evil.pkl").unlink()
    torch.save({"x": 1}, root / "transform.t")
    with pytest.raises(ValueError, match=r"transforms cannot be migrated"):
        from_torchrl(root, device="cpu")
    (root / "transform.t").unlink()
    os.symlink(root / "writer" / "metadata.json", root / "storage" / "link.json")
    with pytest.raises(IntegrityError):
        from_torchrl(root, device="cpu")
    assert not (tmp_path / "unpickled").exists()


def test_a_truncated_memmap_and_foreign_states_are_refused(tmp_path):
    theirs = torchrl_prioritized()
    root = tmp_path / "rb"
    theirs.dumps(root)
    (root / "storage" / "action.memmap").write_bytes(b"\0" * 8)
    with pytest.raises(ValueError, match=r"action.memmap: 8 bytes, expected 128"):
        from_torchrl(root, device="cpu")
    with pytest.raises(ValueError, match=r"not a TorchRL replay buffer state_dict: no \['_storage'"):
        from_torchrl({"storage": {}}, device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no writer/metadata.json: not a TorchRL replay buffer's dumps"):
        from_torchrl(tmp_path / "empty", device="cpu")
    with pytest.raises(TypeError, match=r"a TorchRL dumps directory \(a path\) or a TorchRL buffer's state_dict"):
        from_torchrl(3)


def test_our_loaders_name_the_migration(tmp_path):
    """A TorchRL dumps directory given to our ``loads`` and a TorchRL state given to ``load_state_dict`` are refused
    with the function that migrates them, the buffer unchanged."""
    theirs = torchrl_prioritized()
    theirs.dumps(tmp_path / "rb")
    ours = GPUPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAP), device="cpu")
    with pytest.raises(IntegrityError, match=r"TorchRL's rb.dumps\(\) wrote.*lightning_per.from_torchrl\(path\)"):
        ours.loads(tmp_path / "rb")
    with pytest.raises(ValueError, match=r"lightning_per.from_torchrl\(buffer_state_dict\)"):
        ours.load_state_dict(theirs.state_dict())
    assert len(ours) == 0


def test_the_module_examples_run():
    import doctest

    import lightning_per.replay.migration as migration

    assert doctest.testmod(migration, optionflags=doctest.ELLIPSIS).failed == 0
