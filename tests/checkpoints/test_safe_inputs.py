"""Nothing a user hands us is unpickled, stored priorities stay finite, and bad arguments are named.

Crafted files carry a pickle whose unpickling creates a marker file (``open(marker, "w")``): the marker
must never appear. Expected values come from float32's own limits (``torch.finfo``) and from TorchRL's
scheduler, never from the code under test.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from lightning_per import GPUPrioritizedReplayBuffer, make_replay_buffer
from lightning_per.envs import EnvConfig, make_env, restore_env

FMAX = float(torch.finfo(torch.float32).max)


class _Marker:
    """Unpickling this creates ``path`` (what a crafted file would do with any callable)."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _rows(n: int, start: int = 0) -> TensorDict:
    i = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"observation": i[:, None].expand(n, 3).clone(), "reward": i.clone()}, [n])


def _filled(kind: str = "proportional", **kw):
    rb = make_replay_buffer(64, 8, sampler=kind, device="cpu", generator=torch.Generator().manual_seed(0), **kw)
    rb.extend(_rows(40))
    rb.update_priority(torch.arange(40), torch.linspace(0.1, 4.0, 40))
    return rb


# ------------------------------------------------------------------------------------------ crafted files
@pytest.mark.parametrize("kind", ["proportional", "rank", "uniform"])
@pytest.mark.parametrize("part", ["sampler/sampler.pt", "storage/storage.pt"])
def test_crafted_torch_file_in_a_dump_is_never_unpickled(tmp_path, kind, part):
    marker = tmp_path / "marker"
    src = _filled(kind)
    src.dumps(tmp_path / "dump")
    torch.save({"payload": _Marker(marker)}, tmp_path / "dump" / part)
    rb = _filled(kind)
    before = rb.storage.get(torch.arange(40))["reward"].clone()
    with pytest.raises(Exception):  # noqa: B017 - refused, however it is worded; what matters is below
        rb.loads(tmp_path / "dump")
    assert not marker.exists()
    torch.testing.assert_close(rb.storage.get(torch.arange(40))["reward"], before, rtol=0, atol=0)


def test_prefetch_pickle_next_to_a_dump_is_never_read(tmp_path):
    marker = tmp_path / "marker"
    src = _filled()
    src.dumps(tmp_path / "dump")
    assert not (tmp_path / "dump" / "prefetch.pkl").exists()  # our dumps writes none
    (tmp_path / "dump" / "prefetch.pkl").write_bytes(pickle.dumps(_Marker(marker)))
    rb = _filled()
    try:
        rb.loads(tmp_path / "dump")
    except ValueError:
        pass  # refusing the directory is as good as ignoring the file
    assert not marker.exists()


def _torchrl_layout_storage_with_a_pickled_field(path, marker) -> None:
    """TorchRL's own storage dump (its checkpointer: memory-mapped tensors + JSON) holding a non-tensor field that
    tensordict can only write with pickle (``*.pickle``, unpickled again by ``TensorDict.load_memmap``)."""
    from tensordict import NonTensorData
    from torchrl.data import LazyTensorStorage

    storage = LazyTensorStorage(64)
    storage.set(torch.arange(40), _rows(40))
    storage._storage["meta"] = NonTensorData(_Marker(marker), batch_size=[64])
    storage.dumps(path)
    assert list(path.rglob("*.pickle")), "the crafted dump must hold a pickle for this test to mean anything"


def test_a_torchrl_layout_dump_holding_a_pickle_is_refused_even_with_a_valid_manifest(tmp_path):
    import shutil

    from lightning_per.integrity import IntegrityError, seal_directory

    marker = tmp_path / "marker"
    _filled().dumps(tmp_path / "dump")
    shutil.rmtree(tmp_path / "dump" / "storage")
    _torchrl_layout_storage_with_a_pickled_field(tmp_path / "dump" / "storage", marker)
    seal_directory(tmp_path / "dump", kind="replay_dump")  # anyone can recompute the checksums
    rb = _filled()
    before = rb.storage.get(torch.arange(40))["reward"].clone()
    with pytest.raises(IntegrityError, match=r"other\.pickle: refused, a dump is loaded without unpickling"):
        rb.loads(tmp_path / "dump")
    assert not marker.exists() and len(rb) == 40
    torch.testing.assert_close(rb.storage.get(torch.arange(40))["reward"], before, rtol=0, atol=0)
    # the storage alone, loading TorchRL's layout directly
    with pytest.raises(IntegrityError, match=r"other\.pickle: refused"):
        rb.storage.loads(tmp_path / "dump" / "storage")
    assert not marker.exists() and len(rb) == 40


def _torchrl_layout_dump(tmp_path, marker):
    """A dump of ours whose ``storage/`` is TorchRL's layout, and a copy of that storage outside the dump holding a
    pickled field (``meta/other.pickle``, which tensordict's ``load_memmap`` unpickles)."""
    import shutil

    _filled().dumps(tmp_path / "dump")
    shutil.rmtree(tmp_path / "dump" / "storage")
    _torchrl_layout_storage_with_a_pickled_field(tmp_path / "outside", marker)
    shutil.copytree(tmp_path / "outside", tmp_path / "dump" / "storage")
    shutil.rmtree(tmp_path / "dump" / "storage" / "meta")  # the only part holding a pickle
    return tmp_path / "dump"


@pytest.mark.parametrize("link", ["a directory inside storage/", "storage/ itself", "a file inside storage/",
                                  "the dump directory", "a dangling link"])
def test_a_symlink_anywhere_in_a_dump_is_refused_before_anything_loads(tmp_path, link):
    """``os.walk`` does not enter a symlinked directory: a link to a directory holding tensordict's
    ``other.pickle`` passed the manifest and the pickle checks, and ``load_memmap`` followed it and unpickled."""
    import os

    from lightning_per.integrity import IntegrityError, seal_directory

    marker = tmp_path / "marker"
    dump = _torchrl_layout_dump(tmp_path, marker)
    seal_directory(dump, kind="replay_dump")  # anyone can recompute the checksums; the links come after
    if link == "a directory inside storage/":
        os.symlink(tmp_path / "outside" / "meta", dump / "storage" / "meta")
    elif link == "storage/ itself":
        import shutil

        shutil.rmtree(dump / "storage")
        os.symlink(tmp_path / "outside", dump / "storage")  # every listed file is there, and meta/ too
    elif link == "a file inside storage/":
        (dump / "storage" / "reward.memmap").unlink()
        os.symlink(tmp_path / "outside" / "reward.memmap", dump / "storage" / "reward.memmap")
    elif link == "a dangling link":
        os.symlink(tmp_path / "nowhere", dump / "storage" / "x.json")
    if link == "the dump directory":
        os.symlink(dump, tmp_path / "linked")
        dump = tmp_path / "linked"
    rb = _filled()
    before = rb.storage.get(torch.arange(40))["reward"].clone()
    with pytest.raises(IntegrityError, match="symbolic link") as err:
        rb.loads(dump)
    assert "\n" not in str(err.value)
    if link != "the dump directory":  # the storage alone, loading TorchRL's layout directly
        with pytest.raises(IntegrityError, match="symbolic link"):
            rb.storage.loads(dump / "storage")
    assert not marker.exists() and len(rb) == 40
    torch.testing.assert_close(rb.storage.get(torch.arange(40))["reward"], before, rtol=0, atol=0)


def _tree(root) -> dict[str, tuple[str, bytes | str]]:
    """Every entry under ``root`` (links not followed): ``{relative path: ("link", its target) | ("dir", "") |
    ("file", its bytes)}``."""
    import os

    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("dir", "")
            else:
                with open(path, "rb") as f:
                    out[rel] = ("file", f.read())
    return out


@pytest.mark.parametrize("link", ["the target, to an earlier dump", "the target, dangling",
                                  "a directory inside the target", "a file inside the target"])
def test_dumps_refuses_a_symlinked_target_and_writes_nothing(tmp_path, link):
    """``dumps`` into a link used to put a real directory where the link was and leave the link behind as a hidden
    ``.<name>.<random>.tmp``; a link inside an earlier dump would be replaced with it. Refused by name: every entry
    under ``tmp_path`` stays as it was (the link, what it points to, no leftovers)."""
    import os

    _filled().dumps(tmp_path / "d1")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.json").write_text("{}")
    if link == "the target, to an earlier dump":
        os.symlink(tmp_path / "d1", tmp_path / "link_to_d1")
        target, named = tmp_path / "link_to_d1", tmp_path / "link_to_d1"
    elif link == "the target, dangling":
        os.symlink(tmp_path / "nowhere", tmp_path / "link_to_d1")
        target, named = tmp_path / "link_to_d1", tmp_path / "link_to_d1"
    elif link == "a directory inside the target":
        os.symlink(tmp_path / "outside", tmp_path / "d1" / "storage" / "linked")
        target, named = tmp_path / "d1", tmp_path / "d1" / "storage" / "linked"
    else:
        os.symlink(tmp_path / "outside" / "keep.json", tmp_path / "d1" / "sampler" / "keep.json")
        target, named = tmp_path / "d1", tmp_path / "d1" / "sampler" / "keep.json"
    before = _tree(tmp_path)
    with pytest.raises(ValueError, match="symbolic link") as err:
        _filled().dumps(target)
    assert str(named) in str(err.value) and "\n" not in str(err.value)
    assert _tree(tmp_path) == before
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_a_fifo_in_a_dump_is_refused_without_reading_it(tmp_path):
    import os

    from lightning_per.integrity import IntegrityError

    _filled().dumps(tmp_path / "dump")
    os.mkfifo(tmp_path / "dump" / "storage" / "extra.json")  # a reader would block on it forever
    with pytest.raises(IntegrityError, match="not a regular file"):
        _filled().loads(tmp_path / "dump")


def test_a_torchrl_layout_dump_without_links_or_pickles_still_loads(tmp_path):
    """The refusals above refuse the attack, not TorchRL's layout: the same dump, whole, loads as TorchRL's does."""
    from torchrl.data import LazyTensorStorage

    from lightning_per.integrity import seal_directory

    dump = _torchrl_layout_dump(tmp_path, tmp_path / "marker")
    seal_directory(dump, kind="replay_dump")
    rb = _filled()
    rb.loads(dump)
    oracle = LazyTensorStorage(64)
    oracle.loads(dump / "storage")
    assert len(rb.storage) == len(oracle) == 40
    torch.testing.assert_close(rb.storage.get(torch.arange(40))["reward"], oracle.get(torch.arange(40))["reward"])


def test_a_pytree_layout_naming_a_file_outside_the_dump_is_refused(tmp_path):
    import json

    from lightning_per.integrity import IntegrityError
    from lightning_per.replay.storage_checkpoint import check_torchrl_layout

    root = tmp_path / "storage"
    root.mkdir()
    (root / "storage_metadata.json").write_text(json.dumps(
        {"metadata": {"..x": {"shape": [4], "dtype": "torch.float32"}}, "is_pytree": True, "len": 4}))
    with pytest.raises(IntegrityError, match="not a file of the directory"):
        check_torchrl_layout(root)


def test_the_package_walks_directories_only_through_the_checked_walk():
    """One walk (``integrity.walk_files``) refuses links instead of following or skipping them; no other module
    walks a directory tree (``os.walk``, ``rglob``, recursive ``glob``)."""
    import pathlib
    import re

    import lightning_per

    root = pathlib.Path(lightning_per.__file__).parent
    walks = re.compile(r"os\.walk\(|\.rglob\(|\.glob\([^)]*\*\*|glob\.glob\(|glob\.iglob\(")
    found = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if walks.search(line)]
    assert found == [], found


def test_crafted_env_state_in_a_checkpoint_is_never_unpickled(tmp_path):
    marker = tmp_path / "marker"
    env = make_env(EnvConfig(num_envs=2), seed=0)
    env.reset()
    for snap in ({"kind": "gym_vector", "state": pickle.dumps(_Marker(marker))},
                 {"kind": "gym_vector_json", "state": '[[{"_elapsed_steps": {"__pickle__": "x"}}]]'}):
        with pytest.warns(UserWarning, match="not in the checkpoint"):
            assert restore_env(env, snap) is False
    assert not marker.exists()
    env.close()


# ------------------------------------------------------------------------------------------ overflow
_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=_CUDA)])
@pytest.mark.parametrize("kind", ["proportional", "rank"])
def test_alpha_two_with_a_huge_priority_stays_finite_and_is_counted_once(kind, device):
    # on CUDA: the compiled write and the cached graphs of eager calls (a full ring below) take the same path
    rb = make_replay_buffer(16, 4, sampler=kind, device=device, alpha=2.0, eps=1e-6,
                            generator=torch.Generator().manual_seed(1))
    rb.extend(_rows(8).to(device))
    rb.update_priority(torch.tensor([3], device=device), torch.tensor([1e20], device=device))  # 1e40 > max
    sampler = rb.sampler
    stored = sampler.core.state.leaves.view(-1)[:8]
    assert bool(torch.isfinite(stored).all()) and float(stored[3]) <= FMAX
    assert float(stored[3]) > 1e38  # still (by far) the largest: near float32's max
    assert int(sampler.clamped_priority_count) == 1
    rb.extend(_rows(4, 8).to(device))  # new items take the running max raw priority: not counted again
    assert int(sampler.clamped_priority_count) == 1
    for _ in range(3):  # a full ring (16 slots): the cached-graph write path on CUDA
        rb.extend(_rows(4, 12).to(device))
        rb.update_priority(torch.arange(4, device=device), torch.full((4,), 1e25, device=device))
    assert int(sampler.clamped_priority_count) == 1 + 3 * 4
    assert bool(torch.isfinite(sampler.core.state.leaves).all()) and bool(
        torch.isfinite(sampler.core.state.block_sum).all())
    for _ in range(5):
        batch = rb.sample()  # IndexError here before (an inf block sum)
        assert batch["index"].min() >= 0 and batch["index"].max() < 16
        assert bool(torch.isfinite(batch["priority_weight"]).all())


def test_raising_alpha_keeps_stored_values_finite():
    rb = _filled(alpha=1.0, eps=1e-6)
    rb.update_priority(torch.tensor([0]), torch.tensor([1e30]))
    rb.sampler.alpha = 3.0  # 1e90 would overflow
    assert bool(torch.isfinite(rb.sampler.core.state.leaves).all())
    assert rb.sample()["index"].shape == (8,)


# ------------------------------------------------------------------------------------------ alpha and beta
@pytest.mark.parametrize("name, value, error", [
    ("alpha", True, TypeError), ("beta", False, TypeError), ("alpha", "0.5", TypeError),
    ("alpha", float("inf"), ValueError), ("alpha", float("nan"), ValueError), ("beta", float("inf"), ValueError),
    ("alpha", 1e6, ValueError), ("alpha", -0.1, ValueError), ("beta", torch.ones(2), TypeError),
])
def test_bad_alpha_or_beta_is_refused_naming_it_and_changes_nothing(name, value, error):
    rb = _filled()
    before = (rb.sampler.alpha, rb.sampler.beta, rb.sampler.core.state.leaves.clone())
    with pytest.raises(error, match=name):
        setattr(rb.sampler, name, value)
    assert (rb.sampler.alpha, rb.sampler.beta) == before[:2]
    torch.testing.assert_close(rb.sampler.core.state.leaves, before[2], rtol=0, atol=0)
    with pytest.raises(error, match=name):
        make_replay_buffer(8, 2, device="cpu", **{name: value})


def test_zero_dim_tensors_and_numpy_numbers_set_the_exponents():
    rb = _filled()
    rb.sampler.beta = torch.tensor(0.7)
    rb.sampler.alpha = np.float32(0.5)
    assert rb.sampler.beta == pytest.approx(0.7) and rb.sampler.alpha == pytest.approx(0.5)
    assert isinstance(rb.sampler.beta, float) and isinstance(rb.sampler.alpha, float)


def test_torchrl_linear_scheduler_anneals_beta():
    from torchrl.data.replay_buffers.scheduler import LinearScheduler

    rb = _filled()
    scheduler = LinearScheduler(rb, param_name="beta", final_value=1.0, num_steps=3)
    for _ in range(4):
        scheduler.step()
        rb.sample()
    assert rb.sampler.beta == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ named bad input
@pytest.mark.parametrize("kwargs, error, name", [
    ({"seed": "abc"}, TypeError, "seed"), ({"seed": True}, TypeError, "seed"),
    ({"generator": 42}, TypeError, "generator"), ({"device": "tpu"}, ValueError, "device must be a torch.device"),
])
def test_make_replay_buffer_names_bad_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        make_replay_buffer(8, 2, **{"device": "cpu", **kwargs})


def test_buffer_batch_size_is_checked_at_construction():
    with pytest.raises(ValueError, match="batch_size"):
        GPUPrioritizedReplayBuffer(alpha=0.6, beta=0.4, batch_size=-3, device="cpu")


def test_bad_priorities_are_named_and_empty_updates_are_no_ops():
    rb = _filled()
    before = rb.sampler.core.state.raw.clone()
    with pytest.raises(TypeError, match="priority"):
        rb.update_priority(torch.tensor([0]), ["a"])
    rb.update_priority([], [])  # TorchRL's samplers accept it: nothing to do
    torch.testing.assert_close(rb.sampler.core.state.raw, before, rtol=0, atol=0)


@pytest.mark.parametrize("direct", [True, False])
def test_extend_with_a_refused_priority_writes_nothing(direct):
    rb = make_replay_buffer(16, 4, device="cpu")
    rb.extend(TensorDict({"x": torch.zeros(4, 2), "td_error": torch.ones(4)}, [4]))
    cursor, ring = rb._writer._cursor, rb.storage.get(torch.arange(4))["x"].clone()
    bad = TensorDict({"x": torch.ones(3, 2), "td_error": torch.ones(3, dtype=torch.bool)}, [3])
    if not direct:  # a lazy stack takes TorchRL's extend (the direct path takes plain TensorDicts only)
        bad = torch.stack([bad[i] for i in range(3)])
    with pytest.raises(TypeError, match="td_error"):
        rb.extend(bad)
    assert len(rb) == 4 and rb._writer._cursor == cursor
    torch.testing.assert_close(rb.storage.get(torch.arange(4))["x"], ring, rtol=0, atol=0)


def test_a_capacity_no_memory_can_hold_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="capacity"):
        make_replay_buffer(10**13, 2, device="cpu")


def test_the_package_never_unpickles():
    import pathlib

    import lightning_per

    root = pathlib.Path(lightning_per.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "pickle.load" not in text and "weights_only=False" not in text, path
    assert math.isfinite(FMAX)


@pytest.mark.parametrize("direct", [True, False])
def test_extend_with_several_priorities_per_transition_is_refused_before_the_write(direct):
    # update_priority refuses (n, k) values (as TorchRL's); the data used to be written first
    rb = make_replay_buffer(16, 4, device="cpu")
    rb.extend(TensorDict({"x": torch.zeros(2, 2), "td_error": torch.zeros(2, 3)}, [2]), update_priority=False)
    data = TensorDict({"x": torch.ones(4, 2), "td_error": torch.ones(4, 3)}, [4])
    if not direct:
        data = torch.stack([data[i] for i in range(4)])
    with pytest.raises(ValueError, match="td_error"):
        rb.extend(data)
    assert len(rb) == 2 and rb._writer._cursor == 2
