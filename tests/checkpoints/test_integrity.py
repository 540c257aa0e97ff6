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
from lightning_per.dqn.ddp import SHARD_KIND, load_replay_shard, prune_replay_shards, replay_shard_path
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
        assert bool((rb.sampler.core.state.raw[:n] == gen).all()), "priorities of another dump"
        assert int((rb.sampler.core.state.leaves.view(-1) > 0).sum()) == n
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


def test_a_checkpoint_copied_with_its_manifest_loads_and_a_manifest_of_other_content_is_refused(tmp_path):
    """The manifest names the file it sealed; a copy (``cp last.ckpt bak.ckpt`` and its manifest) has the sealed
    size and SHA-256, so it loads; the same manifest beside a checkpoint of other content is refused."""
    io, ckpt, backup, other = AtomicCheckpointIO(), tmp_path / "last.ckpt", tmp_path / "bak.ckpt", tmp_path / "o.ckpt"
    io.save_checkpoint(_checkpoint(1.0, 5), ckpt)
    io.save_checkpoint(_checkpoint(2.0, 5), other)  # the same size, another content
    for target in (backup, other):
        if target == backup:
            target.write_bytes(ckpt.read_bytes())
        file_manifest_path(target).write_bytes(file_manifest_path(ckpt).read_bytes())
    loaded = io.load_checkpoint(backup)
    assert torch.equal(loaded["state_dict"]["w"], torch.full((64, 64), 1.0)) and loaded["global_step"] == 5
    with pytest.raises(IntegrityError, match=r"o\.ckpt\.manifest\.json: is the manifest of last\.ckpt, and o\.ckpt "
                                             r"does not hold the content sealed there \(SHA-256") as err:
        io.load_checkpoint(other)
    assert "\n" not in str(err.value)


def test_crafted_checkpoint_sealed_with_a_valid_manifest_is_never_unpickled(tmp_path):
    marker = tmp_path / "marker"
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "x": Marker(marker)}, ckpt)
    save_file_manifest(ckpt, "checkpoint", "g")  # an attacker can compute checksums too
    with pytest.raises(IntegrityError, match="not a torch file of plain data"):
        AtomicCheckpointIO().load_checkpoint(ckpt)
    shard = Path(replay_shard_path(ckpt, 0, "g"))
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
    try:  # the generation of the checkpoint on disk: each rank keeps its shard until the new set is complete
        previous = AtomicCheckpointIO().load_checkpoint(ckpt)["dqn_state"]["generation"]
    except (FileNotFoundError, IntegrityError):
        previous = None
    for rank in range(world_size):
        shard = {"generation": generation, "updates": step, "replay": {"rows": torch.full((256,), float(step))}}
        save_torch_file(shard, replay_shard_path(ckpt, rank, generation), SHARD_KIND, generation)
        if previous is not None:
            prune_replay_shards(ckpt, rank, keep=(previous, generation))
    checkpoint = _checkpoint(float(step), step)
    checkpoint["dqn_state"] = {"generation": generation, "shards": world_size, "updates": step}
    AtomicCheckpointIO().save_checkpoint(checkpoint, ckpt)


def test_a_save_interrupted_between_shards_and_checkpoint_leaves_the_previous_set(tmp_path):
    ckpt = tmp_path / "last.ckpt"
    _ddp_save(ckpt, 5)
    state = AtomicCheckpointIO().load_checkpoint(ckpt)["dqn_state"]
    generation = "run-step10"  # both ranks went on to the next save; the checkpoint was not written
    for rank in range(2):
        save_torch_file({"generation": generation, "updates": 10}, replay_shard_path(ckpt, rank, generation),
                        SHARD_KIND, generation)
    assert [load_replay_shard(ckpt, r, state)["updates"] for r in range(2)] == [5, 5]


def test_a_shard_of_another_save_under_this_generations_name_is_refused(tmp_path):
    ckpt = tmp_path / "last.ckpt"
    _ddp_save(ckpt, 5)
    state = AtomicCheckpointIO().load_checkpoint(ckpt)["dqn_state"]
    save_torch_file({"generation": "run-step10", "updates": 10}, replay_shard_path(ckpt, 1, state["generation"]),
                    SHARD_KIND, state["generation"])  # renamed into place and resealed
    with pytest.raises(IntegrityError, match=r"rank1\.run-step5\.replay\.pt: from another save"):
        load_replay_shard(ckpt, 1, state)


@pytest.mark.parametrize("generation", ["../../etc/x", "a/b", "", "x" * 97, 5, None])
def test_a_generation_that_is_not_a_plain_id_never_becomes_a_path(tmp_path, generation):
    with pytest.raises(IntegrityError, match="is not a plain id"):
        replay_shard_path(tmp_path / "last.ckpt", 0, generation)


def test_kill_during_a_ddp_checkpoint_leaves_a_consistent_set(tmp_path):
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
    assert outcomes == ["consistent"] * 8  # the previous set stays whole until the new one is
    step_before = AtomicCheckpointIO().load_checkpoint(ckpt)["global_step"]
    _ddp_save(ckpt, 7)  # the next complete save over the leftovers of the kills: consistent again
    assert check(0) == "consistent"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # stale temp files removed
    assert sorted(p.name for p in tmp_path.iterdir() if ".rank" in p.name) == sorted(  # two saves' sets, no more
        f"last.ckpt.rank{r}.run-step{s}.replay.pt{m}" for r in (0, 1) for s in (7, step_before)
        for m in ("", ".manifest.json"))


def _save_and_die(path: Path, obj, die_at: int) -> None:
    """Fork a process that saves ``obj`` to ``path`` and SIGKILLs itself right after the ``die_at``-th
    ``os.replace`` of the save (the atomic steps: the manifest listing both contents, the file's rename, the
    final manifest); ``die_at`` 0: before the first one."""
    pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        try:
            real, calls = os.replace, [0]

            def replace(src, dst):
                if calls[0] == die_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                real(src, dst)
                calls[0] += 1

            os.replace = replace
            AtomicCheckpointIO().save_checkpoint(obj, path)
            if die_at >= 3:
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.parametrize("die_at, expected", [(0, "old"), (1, "old"), (2, "new"), (3, "new")])
def test_a_kill_at_any_step_of_a_checkpoint_save_leaves_the_old_or_the_new_one(tmp_path, die_at, expected):
    """The kill right after the rename (die_at 2) left a new file under the old manifest: refused by every resume,
    with the previous checkpoint gone."""
    ckpt = tmp_path / "last.ckpt"
    old, new, later = _checkpoint(1.0, 1), _checkpoint(2.0, 2), _checkpoint(3.0, 3)
    AtomicCheckpointIO().save_checkpoint(old, ckpt)
    _save_and_die(ckpt, new, die_at)
    loaded = AtomicCheckpointIO().load_checkpoint(ckpt)
    assert loaded["global_step"] == {"old": 1, "new": 2}[expected]
    assert torch.equal(loaded["state_dict"]["w"], {"old": old, "new": new}[expected]["state_dict"]["w"])
    _save_and_die(ckpt, later, 1)  # the next save is interrupted too, in its window: what was loadable stays
    assert AtomicCheckpointIO().load_checkpoint(ckpt)["global_step"] == loaded["global_step"]
    AtomicCheckpointIO().save_checkpoint(later, ckpt)
    assert AtomicCheckpointIO().load_checkpoint(ckpt)["global_step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "last.ckpt.manifest.json"]


def test_a_manifest_listing_two_contents_accepts_only_those_two(tmp_path):
    ckpt = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(_checkpoint(1.0, 1), ckpt)
    _save_and_die(ckpt, _checkpoint(2.0, 2), 1)  # the manifest lists the new content and the previous one
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    ckpt.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="damaged"):
        AtomicCheckpointIO().load_checkpoint(ckpt)


def test_manifest_nested_deeper_than_the_recursion_limit_is_one_error(tmp_path):
    ckpt = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(_checkpoint(1.0, 1), ckpt)
    file_manifest_path(ckpt).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(IntegrityError, match="nested deeper than"):
        AtomicCheckpointIO().load_checkpoint(ckpt)
