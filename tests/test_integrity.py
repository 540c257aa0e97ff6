"""Integrity of replay dumps, checkpoints and DDP shards: every damaged, truncated, mixed or partial set is
refused naming the file, and a kill -9 at any moment of a save leaves either the previous set, the new one,
or one that is refused -- never a mix.

Each saved generation is recognisable from its content (rows and priorities hold the generation number),
so "consistent" is checked against values the test wrote, not against the code's own output. The kill
loops fork the test process (small buffers, fixed seeds for the kill times).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from lightning_per import make_replay_buffer
from lightning_per.callbacks import AtomicCheckpointIO
from lightning_per.dqn.ddp import SHARD_KIND, load_replay_shard, replay_shard_path
from lightning_per.integrity import (
    MANIFEST_NAME,
    IntegrityError,
    file_manifest_path,
    save_file_manifest,
    save_torch_file,
    seal_directory,
)

CAPACITY = 32
PARTS = ["storage/storage.pt", "sampler/sampler.pt", "writer/metadata.json", "buffer_metadata.json"]


def _rows(n: int, value: float) -> TensorDict:
    return TensorDict({"observation": torch.full((n, 3), value), "reward": torch.full((n,), value)}, [n])


def _buffer(kind: str = "proportional", generation: int = 1, n: int = 20):
    """A buffer whose n rows all hold ``generation`` and whose priorities are ``generation`` too."""
    rb = make_replay_buffer(CAPACITY, 4, sampler=kind, device="cpu", generator=torch.Generator().manual_seed(0))
    rb.extend(_rows(n, float(generation)))
    rb.update_priority(torch.arange(n), torch.full((n,), float(generation)))
    return rb


def _generation_of(rb) -> int:
    """The one generation the loaded buffer's parts all come from (asserts they agree)."""
    n = len(rb)
    rewards = rb.storage.get(torch.arange(n))["reward"]
    gen = int(rewards[0])
    assert bool((rewards == gen).all()), "rows of different dumps"
    assert rb._writer._cursor == n % CAPACITY
    if hasattr(rb.sampler, "_raw"):
        assert bool((rb.sampler._raw[:n] == gen).all()), "priorities of another dump"
        assert int((rb.sampler._leaves.view(-1) > 0).sum()) == n
    return gen


class Marker:
    """Unpickling this creates ``path`` (what a crafted file would do with any callable)."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _flip(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x10
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------------------ replay dumps
@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("damage", ["bit flip", "truncation"])
def test_a_damaged_part_of_a_dump_is_refused_naming_it(tmp_path, part, damage):
    _buffer(generation=2).dumps(tmp_path / "d")
    file = tmp_path / "d" / part
    if damage == "bit flip":
        _flip(file)
    else:
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    rb = _buffer(generation=1)
    with pytest.raises(IntegrityError, match=str(file).replace(".", r"\.")) as err:
        rb.loads(tmp_path / "d")
    assert "\n" not in str(err.value)
    assert ("damaged" if damage == "bit flip" else "truncated") in str(err.value)
    assert _generation_of(rb) == 1 and len(rb) == 20  # unchanged


def test_a_mixed_or_partial_dump_is_refused(tmp_path):
    _buffer(generation=1, n=10).dumps(tmp_path / "a")
    _buffer(generation=2, n=20).dumps(tmp_path / "b")
    # the sampler of dump a copied into dump b
    (tmp_path / "b" / "sampler" / "sampler.pt").write_bytes((tmp_path / "a" / "sampler" / "sampler.pt").read_bytes())
    rb = _buffer(generation=3)
    with pytest.raises(IntegrityError, match="sampler.pt: damaged"):
        rb.loads(tmp_path / "b")
    # a file that is not part of the dump (e.g. TorchRL's prefetch.pkl)
    (tmp_path / "a" / "prefetch.pkl").write_bytes(b"\x80\x04N.")
    with pytest.raises(IntegrityError, match="prefetch.pkl: not part of the dump"):
        rb.loads(tmp_path / "a")
    # no manifest: a dump interrupted before its end, or not ours
    (tmp_path / "a" / "prefetch.pkl").unlink()
    (tmp_path / "a" / MANIFEST_NAME).unlink()
    with pytest.raises(IntegrityError, match="no manifest"):
        rb.loads(tmp_path / "a")
    # a listed part missing
    _buffer(generation=4).dumps(tmp_path / "c")
    (tmp_path / "c" / "writer" / "metadata.json").unlink()
    with pytest.raises(IntegrityError, match=r"metadata\.json: missing"):
        rb.loads(tmp_path / "c")
    assert _generation_of(rb) == 3


def test_parts_of_different_saves_are_refused_even_when_sealed(tmp_path):
    # a "mix" someone sealed anew: the parts' own counts disagree (storage 20 rows, writer 10 writes)
    _buffer(generation=1, n=10).dumps(tmp_path / "a")
    _buffer(generation=2, n=20).dumps(tmp_path / "b")
    for part in ("writer/metadata.json",):
        (tmp_path / "b" / part).write_bytes((tmp_path / "a" / part).read_bytes())
    seal_directory(tmp_path / "b", "replay_dump")
    rb = _buffer(generation=3)
    with pytest.raises(ValueError, match="parts disagree"):
        rb.loads(tmp_path / "b")
    state = _buffer(generation=2, n=20).state_dict()
    state["_writer"] = dict(state["_writer"], _cursor=99)
    with pytest.raises(ValueError, match="cursor 99 lies outside the storage's 32 slots"):
        rb.load_state_dict(state)
    assert _generation_of(rb) == 3


def test_dumps_replaces_the_directory_whole_and_never_a_foreign_one(tmp_path):
    _buffer(generation=1, n=30).dumps(tmp_path / "d")
    _buffer(generation=2, n=5).dumps(tmp_path / "d")  # smaller: nothing of the first may remain
    rb = _buffer(generation=3)
    rb.loads(tmp_path / "d")
    assert len(rb) == 5 and _generation_of(rb) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no staging or old directories left
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a dump directory"):
        _buffer().dumps(mine)
    assert (mine / "notes.txt").read_text() == "keep me" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_leftovers_of_an_interrupted_dump_are_removed_at_the_next(tmp_path):
    stale_dir, stale_file = tmp_path / ".d.abcd1234.tmp", tmp_path / ".d.efgh5678.old"
    stale_dir.mkdir()
    (stale_dir / "x").write_bytes(b"x")
    stale_file.write_bytes(b"y")
    other = tmp_path / ".dd.abcd1234.tmp"  # another dump's: kept
    other.write_bytes(b"z")
    _buffer().dumps(tmp_path / "d")
    assert not stale_dir.exists() and not stale_file.exists() and other.exists()


def _kill_loop(tmp_path: Path, child, check, iterations: int, seed: int, window_s: float) -> list[str]:
    """Fork ``child`` (it saves forever), SIGKILL it at a seeded random moment, then ``check`` what is on disk;
    returns each iteration's outcome."""
    rng = random.Random(seed)
    outcomes = []
    for i in range(iterations):
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns to pytest
            try:
                os.close(ready_r)
                child(i, ready_w)
            finally:
                os._exit(0)
        os.close(ready_w)
        os.read(ready_r, 1)  # its first save is done: the kill lands in a later one
        os.close(ready_r)
        time.sleep(rng.uniform(0.0, window_s))  # when the kill lands (not for the result)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        outcomes.append(check(i))
    return outcomes


def test_kill_during_dumps_leaves_a_consistent_or_refused_dump(tmp_path):
    torch.set_num_threads(1)
    buffers = {g: _buffer(generation=g, n=4 + 3 * g) for g in range(1, 7)}

    def child(i, ready_w):
        g = 0
        while True:
            g = g % 6 + 1
            buffers[g].dumps(tmp_path / "d")
            if ready_w is not None:
                os.write(ready_w, b"1")
                os.close(ready_w)
                ready_w = None

    def check(i):
        rb = _buffer(generation=9)
        try:
            rb.loads(tmp_path / "d")
        except (IntegrityError, FileNotFoundError) as err:
            assert str(tmp_path / "d") in str(err)
            return "refused"
        gen = _generation_of(rb)
        assert len(rb) == 4 + 3 * gen  # every part of one dump
        return "consistent"

    outcomes = _kill_loop(tmp_path, child, check, iterations=8, seed=17, window_s=0.15)
    assert set(outcomes) <= {"consistent", "refused"}
    buffers[3].dumps(tmp_path / "d")  # the next dumps over the leftovers of the kills
    assert check(0) == "consistent" and sorted(p.name for p in tmp_path.iterdir()) == ["d"]


# ------------------------------------------------------------------------------------------ checkpoints
def _checkpoint(value: float, step: int) -> dict:
    return {"state_dict": {"w": torch.full((64, 64), value)}, "epoch": step, "global_step": step,
            "lightning_per_generation": f"run-step{step}"}


@pytest.mark.parametrize("damage", ["bit flip", "truncation", "no manifest", "another file's manifest"])
def test_a_damaged_checkpoint_is_refused_naming_it(tmp_path, damage):
    io, ckpt = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint(_checkpoint(1.0, 5), ckpt)
    assert torch.equal(io.load_checkpoint(ckpt)["state_dict"]["w"], torch.full((64, 64), 1.0))
    if damage == "bit flip":
        _flip(ckpt, 0.7)
    elif damage == "truncation":
        ckpt.write_bytes(ckpt.read_bytes()[:-100])
    elif damage == "no manifest":
        file_manifest_path(ckpt).unlink()
    else:
        io.save_checkpoint(_checkpoint(2.0, 6), tmp_path / "other.ckpt")
        file_manifest_path(ckpt).write_bytes(file_manifest_path(tmp_path / "other.ckpt").read_bytes())
    with pytest.raises(IntegrityError, match=str(ckpt).replace(".", r"\.")) as err:
        io.load_checkpoint(ckpt)
    assert "\n" not in str(err.value)


def test_crafted_checkpoint_sealed_with_a_valid_manifest_is_never_unpickled(tmp_path):
    marker = tmp_path / "marker"
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "x": Marker(marker)}, ckpt)
    save_file_manifest(ckpt, "checkpoint", "g")  # an attacker can compute checksums too
    with pytest.raises(IntegrityError, match="not a torch file of plain data"):
        AtomicCheckpointIO().load_checkpoint(ckpt)
    shard = Path(replay_shard_path(ckpt, 0))
    torch.save({"replay": Marker(marker)}, shard)
    save_file_manifest(shard, SHARD_KIND, "g")
    with pytest.raises(IntegrityError, match="not a torch file of plain data"):
        load_replay_shard(ckpt, 0, {"generation": "g"})
    assert not marker.exists()


def test_stale_temp_files_of_a_checkpoint_are_removed_at_the_next_save(tmp_path):
    ckpt = tmp_path / "last.ckpt"
    stale = [tmp_path / ".last.ckpt.k3j9x0_a.tmp", tmp_path / ".last.ckpt.manifest.json.abcdefgh.tmp"]
    kept = tmp_path / ".last.ckpt.rank1.replay.pt.abcdefgh.tmp"  # rank 1's shard, maybe being written now
    for p in (*stale, kept):
        p.write_bytes(b"partial")
    AtomicCheckpointIO().save_checkpoint(_checkpoint(1.0, 1), ckpt)
    assert not any(p.exists() for p in stale) and kept.exists()
    AtomicCheckpointIO().remove_checkpoint(ckpt)
    assert not ckpt.exists() and not file_manifest_path(ckpt).exists()


def _ddp_save(ckpt: Path, step: int, world_size: int = 2) -> None:
    """What a DDP checkpoint save writes, in its order: every rank's shard (``dqn.ddp``'s strategy hook),
    then rank 0's checkpoint (the same generation id in both)."""
    generation = f"run-step{step}"
    for rank in range(world_size):
        shard = {"generation": generation, "updates": step, "replay": {"rows": torch.full((256,), float(step))}}
        save_torch_file(shard, replay_shard_path(ckpt, rank), SHARD_KIND, generation)
    checkpoint = _checkpoint(float(step), step)
    checkpoint["dqn_state"] = {"generation": generation, "shards": world_size, "updates": step}
    AtomicCheckpointIO().save_checkpoint(checkpoint, ckpt)


def test_shards_and_checkpoint_of_different_steps_are_refused(tmp_path):
    ckpt = tmp_path / "last.ckpt"
    _ddp_save(ckpt, 5)
    state = AtomicCheckpointIO().load_checkpoint(ckpt)["dqn_state"]
    generation = f"run-step{10}"  # rank 1 went on to the next save; the checkpoint was not written
    save_torch_file({"generation": generation, "updates": 10}, replay_shard_path(ckpt, 1), SHARD_KIND, generation)
    assert load_replay_shard(ckpt, 0, state)["updates"] == 5
    with pytest.raises(IntegrityError, match=r"rank1\.replay\.pt: from another save"):
        load_replay_shard(ckpt, 1, state)


def test_kill_during_a_ddp_checkpoint_leaves_a_consistent_or_refused_set(tmp_path):
    torch.set_num_threads(1)
    ckpt = tmp_path / "last.ckpt"

    def child(i, ready_w):
        step = 100 * i
        while True:
            step += 1
            _ddp_save(ckpt, step)
            if ready_w is not None:
                os.write(ready_w, b"1")
                os.close(ready_w)
                ready_w = None

    def check(i):
        try:
            checkpoint = AtomicCheckpointIO().load_checkpoint(ckpt)
            state = checkpoint["dqn_state"]
            shards = [load_replay_shard(ckpt, r, state) for r in range(2)]
        except (IntegrityError, FileNotFoundError) as err:
            assert str(tmp_path) in str(err)
            return "refused"
        step = checkpoint["global_step"]
        assert torch.equal(checkpoint["state_dict"]["w"], torch.full((64, 64), float(step)))
        assert all(s["updates"] == step and torch.equal(s["replay"]["rows"], torch.full((256,), float(step)))
                   for s in shards)
        return "consistent"

    outcomes = _kill_loop(tmp_path, child, check, iterations=8, seed=23, window_s=0.1)
    assert set(outcomes) <= {"consistent", "refused"}  # (most kills land in a shard write: refused)
    _ddp_save(ckpt, 7)  # the next complete save over the leftovers of the kills: consistent again
    assert check(0) == "consistent"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # stale temp files removed
