"""Remote writers (``lightning_per.replay.remote_ingress``): real ``spawn`` processes send batches to the owner over
Gloo on loopback TCP. Every transition carries a unique id and fields derived from it: exact counts, no torn row,
the slots the owner assigned hold the writer's rows; a writer's death is a ConnectionError in the owner, the
owner's death one in every writer, each within seconds.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import time

import pytest
import torch
from tensordict import TensorDict

from lightning_per import RemoteIngress, RemoteWriter, make_replay_buffer
from lightning_per.replay.ingress import IngressLayout
from lightning_per.replay.remote_ingress import pack, unpack

_CHUNK = 500
_DEADLINE_S = 120.0  # every wait ends here: a regression fails instead of hanging


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(ids: torch.Tensor) -> TensorDict:
    """Transitions whose every field is a function of their int64 ``ids`` ``(n,)``."""
    return TensorDict({"id": ids, "obs": ids.to(torch.float32)[:, None] * torch.tensor([1.0, 2.0, 3.0]),
                       "check": (ids * 7 + 3).to(torch.int32), "flag": (ids % 3 == 0)[:, None].expand(-1, 3)},
                      [ids.shape[0]])


def _assert_rows_agree(stored: TensorDict) -> None:
    expected = _rows(stored["id"])
    for key in ("obs", "check", "flag"):
        assert torch.equal(stored[key], expected[key]), f"a torn row: field {key!r} disagrees with its id"


def _writer(rank: int, writers: int, port: int, base: int, n: int, report) -> None:
    """Send ids ``base .. base + n - 1`` (``n < 0``: forever), then report the slots the owner assigned."""
    writer = RemoteWriter(rank, writers, addr="127.0.0.1", port=port, credits=3, timeout=20.0, keep_slots=True)
    bad = _rows(torch.arange(4))
    bad["check"] = bad["check"].long()
    try:
        writer.write(bad)
        refused = None
    except TypeError as err:  # checked in the writer against the layout the owner published: nothing sent
        refused = str(err)
    i = 0
    try:
        while n < 0 or i < n:
            m = _CHUNK if n < 0 else min(_CHUNK, n - i)
            ids = torch.arange(base + i, base + i + m, dtype=torch.int64)
            writer.write(_rows(ids), priority=1.0 + (ids % 5).float())
            i += m
        writer.close()
    except ConnectionError as err:
        report.put(("error", rank, time.monotonic(), str(err)))
        return
    slots = torch.cat(writer.slots).numpy()  # by value: a tensor would travel as a handle to this ending process
    report.put(("done", rank, slots, writer.acknowledged, torch.cuda.is_initialized(), refused))


def _start_writers(ctx, port: int, plan: list[tuple[int, int]], report) -> list:
    procs = [ctx.Process(target=_writer, args=(rank, len(plan), port, base, n, report))
             for rank, (base, n) in enumerate(plan, start=1)]
    for p in procs:
        p.start()
    return procs


def _stop(procs) -> None:
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()


def test_pack_unpack_round_trip():
    ids = torch.arange(5, dtype=torch.int64)
    batch = _rows(ids)
    layout = IngressLayout.of(batch)
    fields, priority = unpack(layout, pack(layout, dict(batch.items()), torch.arange(5.0), 5), 5)
    for key in batch.keys():
        assert torch.equal(fields[key], batch[key])
    assert torch.equal(priority, torch.arange(5.0))


def test_two_writers_over_gloo_every_transition_exactly_once():
    n = 6 * _CHUNK
    rb = make_replay_buffer(10 * n, 32, sampler="proportional", device="cpu")
    port = _free_port()
    ctx = mp.get_context("spawn")
    report = ctx.Queue()
    procs = _start_writers(ctx, port, [(0, n), (1_000_000, n)], report)
    try:
        owner = RemoteIngress(rb, 2, example=_rows(torch.zeros(1, dtype=torch.int64)), addr="127.0.0.1", port=port,
                              timeout=20.0)
        deadline = time.monotonic() + _DEADLINE_S
        while owner.stats.connected:
            assert time.monotonic() < deadline, "the writers did not finish before the deadline: a hang"
            owner.ingest()
            if len(rb):
                rb.sample()
        owner.ingest()
        reports = {r[1]: r for r in (report.get(timeout=30) for _ in procs)}
    finally:
        _stop(procs)
    assert [p.exitcode for p in procs] == [0, 0]
    stored = rb.storage[:len(rb)]
    ids = stored["id"]
    expected = torch.cat([torch.arange(n), torch.arange(1_000_000, 1_000_000 + n)])
    assert len(rb) == 2 * n and torch.equal(ids.sort().values, expected), "lost or duplicated transitions"
    _assert_rows_agree(stored)
    for rank, base in ((1, 0), (2, 1_000_000)):
        kind, _, slots, acknowledged, cuda, _ = reports[rank]
        assert kind == "done" and acknowledged == n and not cuda
        assert torch.equal(ids[torch.from_numpy(slots)], torch.arange(base, base + n)), \
            "the assigned slots do not hold the rows"
    # the priorities the writers sent with each row (1 + id % 5), stored raw at the slots the owner chose
    torch.testing.assert_close(rb.sampler.core.state.raw[:2 * n], 1.0 + (ids % 5).float(), rtol=0, atol=0)
    assert [reports[r][5] for r in (1, 2)] == [
        "write: batch['check'] has dtype torch.int64, the buffer's layout holds torch.int32 (nothing was written)"] * 2
    stats = owner.stats
    assert (stats.writers, stats.connected, stats.received, stats.ingested, stats.lost) == (2, 0, 2 * n, 2 * n, ())
    owner.close()


def test_a_writers_death_is_a_connection_error_in_the_owner_and_the_other_goes_on():
    n = 8 * _CHUNK
    rb = make_replay_buffer(1_000_000, 32, device="cpu")
    port = _free_port()
    ctx = mp.get_context("spawn")
    report = ctx.Queue()
    victim_base = 10_000_000
    procs = _start_writers(ctx, port, [(0, n), (victim_base, -1)], report)
    try:
        owner = RemoteIngress(rb, 2, example=_rows(torch.zeros(1, dtype=torch.int64)), addr="127.0.0.1", port=port,
                              timeout=20.0)
        deadline = time.monotonic() + _DEADLINE_S
        while not (len(rb) and bool((rb.storage[:len(rb)]["id"] >= victim_base).any())):
            assert time.monotonic() < deadline, "the victim wrote nothing before the deadline"
            owner.ingest()
        os.kill(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(ConnectionError, match=r"writer rank\(s\) \[2\] lost"):
            while True:
                assert time.monotonic() - killed < 10, "the writer's death was not reported within 10 s"
                owner.ingest()
        while owner.stats.connected:
            assert time.monotonic() < deadline, "the surviving writer did not finish: a hang"
            owner.ingest()
        owner.ingest()
        kind, rank, _, acknowledged, _, _ = report.get(timeout=30)
    finally:
        _stop(procs)
    assert (kind, rank, acknowledged) == ("done", 1, n)
    stored = rb.storage[:len(rb)]
    ids = stored["id"]
    _assert_rows_agree(stored)
    assert ids.unique().numel() == ids.numel(), "a duplicated transition"
    assert torch.equal(ids[ids < victim_base].sort().values, torch.arange(n))
    victim = ids[ids >= victim_base].sort().values - victim_base
    assert torch.equal(victim, torch.arange(victim.numel())), "the victim's rows are not the prefix it sent"
    assert owner.stats.lost == (2,)
    owner.close()


def _owner(port: int, writers: int, progress) -> None:
    rb = make_replay_buffer(1_000_000, 32, device="cpu")
    owner = RemoteIngress(rb, writers, example=_rows(torch.zeros(1, dtype=torch.int64)), addr="127.0.0.1",
                          port=port, timeout=20.0)
    told = False
    while True:
        owner.ingest()
        if not told and owner.stats.ingested >= 4 * writers * _CHUNK:
            progress.put(os.getpid())
            told = True


def test_the_owners_death_ends_the_writers_with_a_clear_error_within_10_s():
    port = _free_port()
    ctx = mp.get_context("spawn")
    report, progress = ctx.Queue(), ctx.Queue()
    writers = _start_writers(ctx, port, [(0, -1), (1_000_000, -1)], report)
    owner = ctx.Process(target=_owner, args=(port, 2, progress))
    owner.start()
    try:
        progress.get(timeout=_DEADLINE_S)  # the writers are mid-run
        os.kill(owner.pid, signal.SIGKILL)
        killed = time.monotonic()
        errors = [report.get(timeout=30) for _ in writers]
    finally:
        _stop([owner, *writers])
    for kind, rank, when, message in errors:
        assert kind == "error"
        assert when - killed < 10, f"writer {rank} learned of the owner's death after {when - killed:.1f} s"
        assert f"remote writer rank {rank}: the owner at 127.0.0.1:{port} is gone" in message
    assert sorted(p.exitcode for p in writers) == [0, 0]


def test_bad_arguments_are_refused_before_any_connection(monkeypatch):
    example = _rows(torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"rank must be an int in 1 \.\. writers \(2\) \(rank 0 is the owner\), got 0"):
        RemoteWriter(0, 2, addr="127.0.0.1", port=1)
    with pytest.raises(ValueError, match="writers must be an int >= 1"):
        RemoteIngress(make_replay_buffer(10, 2, device="cpu"), 0, example=example, addr="127.0.0.1", port=1)
    with pytest.raises(ValueError, match="backend must be one of"):
        RemoteIngress(make_replay_buffer(10, 2, device="cpu"), 1, example=example, addr="127.0.0.1", port=1,
                      backend="mpi")
    with pytest.raises(ValueError, match="the buffer holds no transition yet"):
        RemoteIngress(make_replay_buffer(10, 2, device="cpu"), 1, addr="127.0.0.1", port=1)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ValueError, match="give addr= and port=, or set MASTER_ADDR and MASTER_PORT"):
        RemoteWriter(1, 1)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "70000")
    with pytest.raises(ValueError, match=r"port must be an int in \[0, 65535\]"):
        RemoteWriter(1, 1)
    with pytest.raises(ValueError, match="credits must be an int >= 1"):
        RemoteWriter(1, 1, credits=0)


def _frame_writer(rank: int, writers: int, port: int, base: int, n: int, chunk: int, report,
                  timeout: float = 20.0) -> None:
    """Send frame transitions of ids ``base .. base + n - 1`` in batches of ``chunk`` (tests/support/_frame_rows.py),
    then report the slots the owner assigned (or the ConnectionError that ended the writer)."""
    from _frame_rows import frame_rows

    writer = RemoteWriter(rank, writers, addr="127.0.0.1", port=port, credits=3, timeout=timeout, keep_slots=True)
    try:
        for i in range(0, n, chunk):
            writer.write(frame_rows(torch.arange(base + i, base + min(n, i + chunk), dtype=torch.int64)))
        writer.close()
    except ConnectionError as err:
        report.put(("error", rank, str(err)))
        return
    report.put(("done", rank, torch.cat(writer.slots).numpy(), writer.acknowledged))


def test_a_frame_buffer_ingests_remote_batches_larger_than_one_extend():
    """A frame-deduplicated buffer (one extend takes 520 transitions), its owner built after the first write without
    an example (the stored layout holds the stacked keys), one writer sending batches of 700, three unacknowledged
    at a time: every row stored exactly once with its stacks, at the slots the writer was told. ~10 s."""
    from _frame_rows import assert_frames_agree, frame_rows

    n = 2100
    rb = make_replay_buffer(4096, 64, device="cpu", frame_stack=4)
    rb.extend(frame_rows(torch.arange(-64, 0)))
    port = _free_port()
    ctx = mp.get_context("spawn")
    report = ctx.Queue()
    proc = ctx.Process(target=_frame_writer, args=(1, 1, port, 0, n, 700, report))
    proc.start()
    try:
        owner = RemoteIngress(rb, 1, addr="127.0.0.1", port=port, timeout=20.0)
        deadline = time.monotonic() + _DEADLINE_S
        while owner.stats.connected:
            assert time.monotonic() < deadline, "the writer did not finish before the deadline: a hang"
            owner.ingest()
        owner.ingest()
        kind, _, slots, acknowledged = report.get(timeout=30)
    finally:
        _stop([proc])
    assert proc.exitcode == 0 and kind == "done" and acknowledged == n
    stored = rb.storage[:len(rb)]
    assert len(rb) == 64 + n
    assert torch.equal(stored["id"].sort().values, torch.arange(-64, n)), "lost or duplicated transitions"
    assert_frames_agree(stored)
    assert torch.equal(stored["id"][torch.from_numpy(slots)], torch.arange(n)), "the slots do not hold the rows"
    stats = owner.stats
    assert (stats.received, stats.ingested, stats.lost) == (n, n, ())
    owner.close()


def test_a_remote_ingest_whose_extend_fails_keeps_the_batches_queued():
    """A frame storage that takes no transition in one extend (frames = 14, window 7 < 2 x 4): the owner's ingest
    raises the extend's ValueError, again at the next call, with every received row still queued (none ingested,
    nothing stored); closing the owner ends the writer with a ConnectionError (its 4 s timeout at most). ~10 s."""
    from _frame_rows import frame_rows

    rb = make_replay_buffer(64, 8, device="cpu", frame_stack=4, frames=14)
    port = _free_port()
    ctx = mp.get_context("spawn")
    report = ctx.Queue()
    proc = ctx.Process(target=_frame_writer, args=(1, 1, port, 0, 16, 8, report, 4.0))
    proc.start()
    try:
        owner = RemoteIngress(rb, 1, example=frame_rows(torch.zeros(1, dtype=torch.int64)), addr="127.0.0.1",
                              port=port, timeout=4.0)
        deadline = time.monotonic() + _DEADLINE_S
        while owner.stats.received < 16:  # both batches arrived (credits: 3)
            assert time.monotonic() < deadline, "the writer's batches did not arrive before the deadline"
        for _ in range(2):
            with pytest.raises(ValueError, match="nothing was written"):
                owner.ingest()
            assert (owner.stats.received, owner.stats.ingested, len(rb)) == (16, 0, 0)
        owner.close()
        assert report.get(timeout=60)[0] == "error"
    finally:
        _stop([proc])
