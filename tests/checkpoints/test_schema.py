"""One schema rule for every checkpointed part (lightning_per.schema): refuse newer, migrate older, atomic saves.

Each part gets a state in its *old* layout, written out by hand from the layout the code documented before
(not produced by the code under test), that must still load, and a state of a newer schema that must be
refused with a message naming the part, the version found and the versions this code reads.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from tensordict import TensorDict

from lightning_per import GPUTensorStorage, make_replay_buffer
from lightning_per.callbacks import AsyncMetricsCallback
from lightning_per.callbacks.run_artifacts import RunArtifactsCallback
from lightning_per.dqn import DQN, ReplayConfig
from lightning_per.integrity import IntegrityError, verify_directory
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.random import GPURandomSampler
from lightning_per.schema import SCHEMA_KEY, check, stamp

N = 8


# ------------------------------------------------------------------------------------------ the rule itself
def test_stamp_sets_the_one_key_and_check_returns_a_current_state_unchanged():
    state = stamp({"a": 1}, "demo", 3)
    assert state == {"a": 1, SCHEMA_KEY: 3} and SCHEMA_KEY == "_schema_version"
    assert check(state, "demo", 3) is state
    with pytest.raises(ValueError, match="demo: schema version must be an int >= 0"):
        stamp({}, "demo", -1)


def test_check_refuses_newer_naming_part_found_and_supported():
    with pytest.raises(ValueError, match=r"demo checkpoint schema 5 is newer than this code's "
                                         r"\(it reads one of 1, 2, 3\): upgrade lightning_per"):
        check({SCHEMA_KEY: 5}, "demo", 3, {1: dict, 2: dict})


def test_check_runs_migrations_oldest_to_current_and_stamps_the_result():
    calls = []

    def step(v):
        def migrate(state):
            calls.append(v)
            return {**state, f"from{v}": True}
        return migrate

    old = {SCHEMA_KEY: 1, "x": 0}
    out = check(old, "demo", 3, {1: step(1), 2: step(2)})
    assert calls == [1, 2] and out == {SCHEMA_KEY: 3, "x": 0, "from1": True, "from2": True}
    assert old == {SCHEMA_KEY: 1, "x": 0}  # the saved state is not modified


def test_check_refuses_older_without_a_complete_migration_chain():
    with pytest.raises(ValueError, match=r"demo checkpoint schema 0 is not supported \(this code reads one of 1, 2"):
        check({SCHEMA_KEY: 0}, "demo", 2, {1: dict})
    with pytest.raises(ValueError, match=r"demo checkpoint schema 1 is not supported \(this code reads 2\)"):
        check({SCHEMA_KEY: 1}, "demo", 2)


def test_check_missing_version_is_the_given_oldest_or_refused():
    assert check({"x": 1}, "demo", 1, missing=1) == {"x": 1}
    assert check({"x": 1}, "demo", 1, {0: dict}, missing=0) == {"x": 1, SCHEMA_KEY: 1}
    with pytest.raises(ValueError, match="demo checkpoint schema None is not supported"):
        check({"x": 1}, "demo", 1)
    for bad in ("1", True, 1.0):
        with pytest.raises(ValueError, match="is not supported"):
            check({SCHEMA_KEY: bad}, "demo", 1)


def test_check_reads_legacy_keys_and_every_version_must_be_readable():
    assert check({"version": 1}, "demo", 1, legacy_keys=("version",)) == {"version": 1}
    with pytest.raises(ValueError, match="demo checkpoint schema 2 is newer"):
        check({SCHEMA_KEY: 1, "version": 2}, "demo", 1, legacy_keys=("version",))
    with pytest.raises(ValueError, match="demo checkpoint schema 0 is not supported"):
        check({SCHEMA_KEY: 1, "version": 0}, "demo", 1, legacy_keys=("version",))
    migrated = check({"version": 0, "x": 1}, "demo", 1, {0: dict}, legacy_keys=("version",))
    assert migrated == {"x": 1, SCHEMA_KEY: 1}  # the legacy key is dropped once migrated


# ------------------------------------------------------------------------------------------ every part
def _uniform_rng(seed: int = 3) -> dict:
    """A sampler's saved ``rng`` entry as documented: the generator's state and the seed's fingerprint."""
    return {"generator": torch.Generator().manual_seed(seed).get_state(), "fingerprint": None, "buffer_seen": None}


def test_storage_schema_0_and_1_per_key_states_load_and_a_newer_is_refused():
    obs = torch.arange(N * 3, dtype=torch.float32).view(N, 3)
    reward = torch.arange(N, dtype=torch.float32)
    v0 = {"_storage": {"observation": obs.clone(), "reward": reward.clone()}, "initialized": True, "_len": 5}
    v1 = {**v0, "_schema_version": 1}
    for state in (v0, v1):
        for packed in (False, True):
            storage = GPUTensorStorage(N, device="cpu", packed=packed)
            storage.load_state_dict(state)
            assert len(storage) == 5
            torch.testing.assert_close(storage[torch.arange(5)]["observation"], obs[:5])
            torch.testing.assert_close(storage[torch.arange(5)]["reward"], reward[:5])
            assert storage.state_dict()[SCHEMA_KEY] == 2
    with pytest.raises(ValueError,
                       match=r"storage checkpoint schema 3 is newer than this code's \(it reads one of 0, 1, 2\)"):
        GPUTensorStorage(N, device="cpu").load_state_dict({**v0, "_schema_version": 3})


def test_prioritized_sampler_schema_1_state_loads_and_a_newer_is_refused():
    sampler = GPUPrioritizedSampler(N, 0.6, 0.4, device="cpu")
    # the padded slots of the tree's leaves
    raw = torch.zeros(sampler.core.state.raw.shape, dtype=sampler.core.state.raw.dtype)
    raw[:3] = torch.tensor([0.5, 2.0, 1.0])
    v1 = {"_schema_version": 1, "kind": "GPUPrioritizedSampler", "max_capacity": N, "alpha": 0.6, "beta": 0.4,
          "eps": 1e-8, "raw": raw, "max_raw": torch.tensor(2.0, dtype=raw.dtype),
          "n_clamped": torch.tensor(0), "n_dropped": torch.tensor(0), "written": raw > 0, "rng": _uniform_rng(),
          "device_rng": None}
    sampler.load_state_dict(v1)
    p = sampler.probabilities()
    v = (raw[:3].double() + 1e-8) ** 0.6  # PER eq. 1 over the written slots
    torch.testing.assert_close(p[:3], v / v.sum())
    assert float(p[3:].sum()) == 0.0
    with pytest.raises(ValueError, match=r"sampler checkpoint schema 2 is newer than this code's \(it reads 1\)"):
        GPUPrioritizedSampler(N, 0.6, 0.4, device="cpu").load_state_dict({**v1, "_schema_version": 2})


def test_uniform_sampler_unversioned_state_loads_and_a_newer_is_refused(tmp_path):
    sampler = GPURandomSampler(device="cpu")
    sampler.load_state_dict({"kind": "GPURandomSampler", "rng": _uniform_rng(5)})
    assert torch.equal(sampler.generator.get_state(), torch.Generator().manual_seed(5).get_state())
    with pytest.raises(ValueError, match="sampler checkpoint schema 2 is newer"):
        sampler.load_state_dict({"_schema_version": 2, "kind": "GPURandomSampler", "rng": _uniform_rng()})


def test_sampler_dumps_are_atomic(tmp_path, monkeypatch):
    sampler = GPURandomSampler(device="cpu", seed=1)
    sampler.dumps(tmp_path)
    before = (tmp_path / "sampler.pt").read_bytes()

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        GPURandomSampler(device="cpu", seed=2).dumps(tmp_path)
    assert (tmp_path / "sampler.pt").read_bytes() == before  # the previous file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sampler.pt"]  # no temp file left
    monkeypatch.undo()
    sampler = GPUPrioritizedSampler(N, 0.6, 0.4, device="cpu")
    sampler.dumps(tmp_path / "p")
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["sampler.pt", "sampler_metadata.json"]
    assert json.loads((tmp_path / "p" / "sampler_metadata.json").read_text())[SCHEMA_KEY] == 1


def test_dqn_state_version_1_loads_and_newer_or_older_are_refused():
    model = DQN(replay=ReplayConfig(capacity=64, batch_size=8), hidden_sizes=[8])  # its resume checks
    old = {"version": 1, "env_steps": 10, "updates": 2, "credit": 0.0, "metrics": model.metrics.state_dict(),
           "torch_rng": torch.get_rng_state(), "collector": None}
    assert model.check_resume({"dqn_state": old}, "run.ckpt", 1, 0) is None
    with pytest.raises(ValueError, match=r"run\.ckpt: dqn_state version 2 is newer than this code's \(it reads 1\)"):
        model.check_resume({"dqn_state": {**old, "_schema_version": 2}}, "run.ckpt", 1, 0)
    with pytest.raises(ValueError, match="dqn_state version None is not supported"):
        model.check_resume({"dqn_state": {"env_steps": 1}}, "run.ckpt", 1, 0)


def test_async_metrics_state_old_layouts_load_and_a_newer_is_refused():
    for old in ({"version": 1, "history": [{"epoch": 0, "time_s": 1.0}]}, {"history": [{"epoch": 0, "time_s": 1.0}]}):
        cb = AsyncMetricsCallback()
        cb.load_state_dict(old)
        assert cb.history == [{"epoch": 0, "time_s": 1.0}]
    assert AsyncMetricsCallback().state_dict()[SCHEMA_KEY] == 1
    with pytest.raises(ValueError, match="AsyncMetricsCallback state version 2 is newer"):
        AsyncMetricsCallback().load_state_dict({"_schema_version": 2, "history": []})


def test_run_artifacts_state_old_layouts_load_and_a_newer_is_refused():
    for old in ({"version": 1, "wall_time_s": 4.0}, {"wall_time_s": 4.0}):
        arts = RunArtifactsCallback(plot=False)
        arts.load_state_dict(old)
        assert arts.wall_time_s() == 4.0
    assert RunArtifactsCallback(plot=False).state_dict()[SCHEMA_KEY] == 1
    with pytest.raises(ValueError, match="RunArtifactsCallback state version 2 is newer"):
        RunArtifactsCallback(plot=False).load_state_dict({"_schema_version": 2, "wall_time_s": 1.0})


def _hand_manifest(directory, version):
    data = b"rows"
    (directory / "part.bin").write_bytes(data)
    manifest = {"format": "lightning_per.manifest", "version": version, "kind": "replay_dump", "generation": "g1",
                "files": {"part.bin": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}, "meta": {}}
    (directory / "MANIFEST.json").write_text(json.dumps(manifest))


def test_manifest_version_1_verifies_and_a_newer_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    _hand_manifest(tmp_path / "a", 1)
    verify_directory(tmp_path / "a", "replay_dump")
    (tmp_path / "b").mkdir()
    _hand_manifest(tmp_path / "b", 2)
    with pytest.raises(IntegrityError, match=r"MANIFEST\.json: manifest version 2 is newer.*upgrade lightning_per"):
        verify_directory(tmp_path / "b", "replay_dump")


def _rows(n: int) -> TensorDict:
    i = torch.arange(n, dtype=torch.float32)
    return TensorDict({"observation": i[:, None].expand(n, 3).clone(), "reward": i.clone()}, [n])


def test_replay_buffer_state_under_the_old_key_loads_and_a_newer_is_refused():
    rb = make_replay_buffer(N, 4, device="cpu")
    rb.extend(_rows(5))
    state = rb.state_dict()
    assert state[SCHEMA_KEY] == 1 and "_lightning_per_schema" not in state
    # the layout before the one key: TorchRL's state plus "_lightning_per_schema"
    old = {**{k: v for k, v in state.items() if k != SCHEMA_KEY}, "_lightning_per_schema": 1}
    fresh = make_replay_buffer(N, 4, device="cpu")
    fresh.load_state_dict(old)
    assert len(fresh) == 5
    torch.testing.assert_close(fresh.sampler.probabilities(), rb.sampler.probabilities())
    for newer in ({**state, SCHEMA_KEY: 2}, {**old, "_lightning_per_schema": 2}):
        with pytest.raises(ValueError, match=r"replay checkpoint schema 2 is newer than this code's \(it reads 1\)"):
            make_replay_buffer(N, 4, device="cpu").load_state_dict(newer)


@pytest.mark.parametrize("kind", ["slice", "prioritized_slice"])
def test_slice_index_of_a_newer_schema_is_refused_naming_it(kind):
    rb = make_replay_buffer(N, 4, sampler=kind, device="cpu", slice_len=2)
    sampler_state = rb.state_dict()["_sampler"]
    assert sampler_state["slice_schema"] == 2
    with pytest.raises(ValueError, match="slice sampler checkpoint schema 3 is newer"):
        rb.sampler.check_state_dict({**sampler_state, "slice_schema": 3})


def test_frame_ring_without_a_version_passes_its_checks_and_a_newer_is_refused():
    storage = make_replay_buffer(16, 4, device="cpu", frame_stack=2, frames=100, packed=True).storage
    # the ring as documented (frames, their hashes, each slot's positions and oldest serial, frames written)
    ring = {"frame_stack": 2, "n_frames": 100, "window": 2, "frames": torch.zeros(100, 4, 4, dtype=torch.uint8),
            "frame_hash": torch.zeros(100, dtype=torch.int64),
            "frame_positions": torch.zeros(16, 4, dtype=torch.int32), "oldest": torch.zeros(16, dtype=torch.int64),
            "frames_written": torch.tensor(0)}
    state = {"_schema_version": 2, "_storage": {}, "initialized": False, "_len": 0}
    storage.check_state_dict({**state, "frame_ring": ring})
    with pytest.raises(ValueError, match="frame_ring schema 2 is newer"):
        storage.check_state_dict({**state, "frame_ring": {**ring, SCHEMA_KEY: 2}})
