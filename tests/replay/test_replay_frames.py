"""FrameStackStorage: rebuilt stacks against a NumPy model of an env's frame stack, dedup counts, the ring's
overwrite (no sample returns a lost frame; hypothesis), the sampler's masking, bad input, checkpoints,
TorchRL's buffer, and the compiled gather against the reference (Triton's interpreter on CPU)."""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer

from lightning_per import FrameStackStorage, GPUPrioritizedSampler, make_replay_buffer
from lightning_per.ops import frames as frame_ops
from lightning_per.ops import reference
from lightning_per.replay.adapter import mask_slots

SHAPE = (3, 4)  # small frames: 12 bytes (a multiple of 4, not of 8)


class StackModel:
    """NumPy model of ``num_envs`` environments behind Gymnasium's ``FrameStackObservation``: each step shows a
    fresh random frame; the stack holds the last ``S`` frames, and a reset fills it with ``S`` copies of the
    reset frame (``padding="reset"``, the wrapper's default) or ``S - 1`` zero frames and the reset frame
    (``"zero"``); episodes last 1 to ``max_len`` steps. ``n_step`` > 1 gives the next observation ``n`` steps
    later, or the episode's last one (the DQN collector's n-step transitions)."""

    def __init__(self, num_envs, stack, n_step=1, max_len=6, padding="reset", seed=0):
        self.rng = np.random.default_rng(seed)
        self.e, self.s, self.n, self.max_len, self.padding = num_envs, stack, n_step, max_len, padding
        self.pending = [deque() for _ in range(num_envs)]
        self.transitions = []  # (observation, next observation) by id

    def _frame(self):
        return self.rng.integers(1, 256, SHAPE, dtype=np.uint8)  # never all zero (the zero padding's frame)

    def _episode(self):
        first = self._frame()
        pad = first if self.padding == "reset" else np.zeros(SHAPE, np.uint8)
        window = deque([pad] * (self.s - 1) + [first], maxlen=self.s)
        stacks = [np.stack(window)]
        for _ in range(int(self.rng.integers(1, self.max_len + 1))):
            window.append(self._frame())
            stacks.append(np.stack(window))
        last = len(stacks) - 1
        return [(stacks[k], stacks[min(k + self.n, last)]) for k in range(last)]

    def step(self):
        """One vector step: one transition per env, ``(observation, next_observation, id)`` arrays."""
        obs, nxt, ids = [], [], []
        for env in range(self.e):
            if not self.pending[env]:
                self.pending[env].extend(self._episode())
            o, x = self.pending[env].popleft()
            ids.append(len(self.transitions))
            self.transitions.append((o, x))
            obs.append(o)
            nxt.append(x)
        return np.stack(obs), np.stack(nxt), np.array(ids)


def _td(obs, nxt, ids):
    return TensorDict({"observation": torch.from_numpy(obs), "next_observation": torch.from_numpy(nxt),
                       "tid": torch.from_numpy(ids), "reward": torch.from_numpy(ids).float()},
                      batch_size=[len(ids)])


def _fill(rb, model, steps):
    for _ in range(steps):
        rb.extend(_td(*model.step()))


def _check_slots(storage, model, index):
    """Every slot of ``index`` returns its transition's stacks exactly as the model made them."""
    batch = storage.get(torch.as_tensor(index, dtype=torch.int64))
    for row, tid in enumerate(batch["tid"].tolist()):
        want_obs, want_next = model.transitions[tid]
        np.testing.assert_array_equal(batch["observation"][row].numpy(), want_obs)
        np.testing.assert_array_equal(batch["next_observation"][row].numpy(), want_next)


class _FrameEnv(gym.Env):
    """A Gymnasium env showing the model's frames (to check the model against FrameStackObservation)."""

    observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
    action_space = gym.spaces.Discrete(1)

    def __init__(self, frames):
        self.frames, self.t = frames, 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.frames[0], {}

    def step(self, action):
        self.t += 1
        return self.frames[self.t], 0.0, self.t == len(self.frames) - 1, False, {}


@pytest.mark.parametrize("padding", ["reset", "zero"])
def test_model_matches_gymnasium_frame_stack(padding):
    model = StackModel(1, 4, padding=padding, max_len=5, seed=3)
    episode = model._episode()
    frames = [episode[0][0][-1]] + [nxt[-1] for _, nxt in episode]  # the frames the episode showed
    env = gym.wrappers.FrameStackObservation(_FrameEnv(frames), 4, padding_type=padding)
    obs, _ = env.reset()
    for want_obs, want_next in episode:
        np.testing.assert_array_equal(obs, want_obs)
        obs, *_ = env.step(0)
        np.testing.assert_array_equal(obs, want_next)


@pytest.mark.parametrize("padding", ["reset", "zero"])
@pytest.mark.parametrize("n_step", [1, 3])
def test_stacks_equal_model_across_episodes_and_wraparound(padding, n_step):
    model = StackModel(3, 4, n_step=n_step, padding=padding, seed=1)
    rb = make_replay_buffer(20, 8, device="cpu", frame_stack=4, frames=200)
    _fill(rb, model, 30)  # 90 transitions through 20 slots
    storage = rb.storage
    assert len(storage) == 20
    assert bool(storage.slot_valid.all())  # 200 frames outlive the 20 transitions that use them
    _check_slots(storage, model, range(20))
    assert sorted(storage.get(torch.arange(20))["tid"].tolist()) == list(range(70, 90))  # the newest ones


def test_each_distinct_frame_is_stored_once():
    model = StackModel(2, 4, seed=2)
    rb = make_replay_buffer(64, 8, device="cpu", frame_stack=4, frames=2048)
    _fill(rb, model, 25)
    distinct = {f.tobytes() for o, x in model.transitions for f in (*o, *x)}
    assert int(rb.storage.frames_written) == len(distinct)
    _check_slots(rb.storage, model, range(50))


@settings(max_examples=15, deadline=None)
@given(num_envs=st.integers(1, 3), stack=st.integers(1, 4), n_step=st.integers(1, 3),
       max_size=st.integers(4, 24), spare=st.integers(0, 40), steps=st.integers(1, 25),
       padding=st.sampled_from(["reset", "zero"]), seed=st.integers(0, 2**16))
def test_no_sample_returns_an_overwritten_frame(num_envs, stack, n_step, max_size, spare, steps, padding, seed):
    """Property: with rings of frames too small for the transitions (``spare`` frames beyond one write), every
    slot the storage calls valid returns exactly the model's stacks, every draw lands on such a slot, and the
    newest write is always valid."""
    window = 2 * stack * num_envs
    model = StackModel(num_envs, stack, n_step=n_step, padding=padding, seed=seed)
    rb = make_replay_buffer(max_size, 16, device="cpu", frame_stack=stack,
                            frames=window + 2 * stack * num_envs + spare,
                            generator=torch.Generator().manual_seed(seed))
    rb.storage.window = window
    for _ in range(steps):
        index = rb.extend(_td(*model.step()))
        valid = rb.storage.slot_valid
        assert bool(valid[index].all())
        _check_slots(rb.storage, model, torch.nonzero(valid).flatten())
        batch = rb.sample()
        assert bool(valid[batch["index"]].all())
        for row, tid in enumerate(batch["tid"].tolist()):
            np.testing.assert_array_equal(batch["observation"][row].numpy(), model.transitions[tid][0])
            np.testing.assert_array_equal(batch["next_observation"][row].numpy(), model.transitions[tid][1])


def test_sampler_gives_invalid_slots_no_mass_even_after_update():
    model = StackModel(2, 4, max_len=2, seed=5)  # short episodes: many new frames a step
    rb = make_replay_buffer(32, 8, device="cpu", frame_stack=4, frames=40)
    rb.storage.window = 16
    _fill(rb, model, 20)
    valid = rb.storage.slot_valid.clone()
    assert 0 < int(valid.sum()) < 32  # the ring of 40 frames lost some transitions' frames
    rb.update_priority(torch.arange(32), torch.full((32,), 5.0))
    p = rb.sampler.probabilities()
    assert bool((p[~valid] == 0).all()) and bool((p[valid] > 0).all())
    # P(i) over the valid slots: all equal after the update (exact, from the stored values)
    torch.testing.assert_close(p[valid], torch.full_like(p[valid], 1.0 / int(valid.sum())))


def test_bad_input_is_a_clear_error_and_changes_nothing():
    model = StackModel(2, 4, seed=6)
    rb = make_replay_buffer(16, 4, device="cpu", frame_stack=4, frames=200)
    _fill(rb, model, 3)
    storage = rb.storage
    before = (len(rb), int(storage.frames_written), storage.frames.clone(), storage.frame_positions.clone(),
              rb.sampler.probabilities().clone())
    obs, nxt, ids = model.step()
    with pytest.raises(ValueError, match=r"frame_stack=4 does not match data\['observation'\]"):
        rb.extend(_td(obs[:, :3], nxt[:, :3], ids))
    with pytest.raises(TypeError, match=r"data\['next_observation'\] must hold uint8 frames, got torch.float32"):
        rb.extend(TensorDict({"observation": torch.from_numpy(obs), "tid": torch.from_numpy(ids),
                              "next_observation": torch.from_numpy(nxt).float(),
                              "reward": torch.zeros(2)}, [2]))
    with pytest.raises(ValueError, match="frames of shape"):
        rb.extend(_td(obs[..., :2], nxt[..., :2], ids))
    with pytest.raises(ValueError, match="no stacked-frame key 'next_observation'"):
        rb.extend(TensorDict({"observation": torch.from_numpy(obs), "tid": torch.from_numpy(ids)}, [2]))
    # a sparse leaf, stacked or not, names its key and layout (rows.check_dense)
    for key in ("observation", "tid"):
        sparse = _td(obs, nxt, ids)
        sparse[key] = sparse[key].to_sparse()
        with pytest.raises(TypeError, match=rf"data\['{key}'\] has layout torch.sparse_coo"):
            rb.extend(sparse)
    after = (len(rb), int(storage.frames_written), storage.frames, storage.frame_positions,
             rb.sampler.probabilities())
    assert before[:2] == after[:2]
    for a, b in zip(before[2:], after[2:]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad, name", [(dict(frame_stack=0), "frame_stack"),
                                       (dict(frame_stack=4, frames=10, window=16), "frames"),
                                       (dict(frame_stack=4, window=0), "window"),
                                       (dict(frame_stack=4, keys=("obs", "obs")), "keys")])
def test_bad_arguments_name_themselves(bad, name):
    with pytest.raises(ValueError, match=f"^{name} must"):
        FrameStackStorage(8, device="cpu", **bad)


def test_frame_stack_needs_the_proportional_sampler():
    with pytest.raises(ValueError, match="frame_stack needs sampler='proportional'"):
        make_replay_buffer(8, 2, device="cpu", frame_stack=4, sampler="uniform")


def test_checkpoint_round_trip_and_refusals(tmp_path):
    model = StackModel(2, 4, seed=7)
    rb = make_replay_buffer(16, 4, device="cpu", frame_stack=4, frames=100, packed=True)
    _fill(rb, model, 12)
    state = rb.state_dict()
    fresh = make_replay_buffer(16, 4, device="cpu", frame_stack=4, frames=100, packed=True)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.storage.slot_valid, rb.storage.slot_valid)
    _check_slots(fresh.storage, model, range(16))
    rb.dumps(tmp_path / "rb")
    loaded = make_replay_buffer(16, 4, device="cpu", frame_stack=4, frames=100, packed=True)
    loaded.loads(tmp_path / "rb")
    _check_slots(loaded.storage, model, range(16))
    torch.testing.assert_close(loaded.sampler.probabilities(), rb.sampler.probabilities())
    for other, match in ((dict(frame_stack=3), "frame_stack=4"), (dict(frame_stack=4, frames=101), "frames=100")):
        refuse = make_replay_buffer(16, 4, device="cpu", frames=other.pop("frames", 100), packed=True, **other)
        with pytest.raises(ValueError, match=match):
            refuse.load_state_dict(state)
        assert len(refuse) == 0 and refuse.storage.frames is None
    with pytest.raises(ValueError, match="no frame_ring"):
        FrameStackStorage(16, frame_stack=4, frames=100, device="cpu").load_state_dict(
            make_replay_buffer(16, 4, device="cpu").storage.state_dict())


def test_torchrl_buffer_with_one_import():
    model = StackModel(2, 2, seed=8)
    rb = TensorDictReplayBuffer(storage=FrameStackStorage(16, frame_stack=2, frames=100, device="cpu"),
                                sampler=GPUPrioritizedSampler(16, alpha=0.6, beta=0.4, device="cpu"),
                                batch_size=4, priority_key="td_error")
    for _ in range(10):
        rb.extend(_td(*model.step()))
    batch = rb.sample()
    for row, tid in enumerate(batch["tid"].tolist()):
        np.testing.assert_array_equal(batch["observation"][row].numpy(), model.transitions[tid][0])
    batch.set("td_error", torch.rand(4))
    rb.update_tensordict_priority(batch)


def test_hash_is_exact_integer_sum():
    frames = torch.randint(0, 256, (5, 7056), dtype=torch.uint8)
    w = frame_ops.hash_weights(7056)
    want = [sum(int(a) * int(b) for a, b in zip(f.tolist(), w.tolist())) for f in frames[:2]]
    assert frame_ops.hash_frames(frames[:2], w).tolist() == want  # no int64 overflow


def test_hash_in_chunks_equals_one_pass():
    frames = torch.randint(0, 256, (37, 50), dtype=torch.uint8)
    w = frame_ops.hash_weights(50)
    assert torch.equal(frame_ops.hash_frames(frames, w, chunk=8), frame_ops.hash_frames(frames, w))


def _dedup_model(frames, hashes, ring, ring_hash, written, window):
    """Plain-Python statement of dedup_frames' contract, frame by frame: the most recent written candidate of equal
    hash if its bytes are equal; else the first earlier frame of the batch of equal hash that matched no candidate,
    if its bytes are equal; else a new frame with the next serial."""
    n_ring = len(ring) - 1
    roots, own, new = {}, [], []
    for i, (frame, h) in enumerate(zip(frames, hashes)):
        match = next((written - b for b in range(1, window + 1)
                      if written - b >= 0 and ring_hash[(written - b) % n_ring] == h), None)
        if match is not None and ring[match % n_ring] == frame:
            own.append(match), new.append(False)
            continue
        j = roots.setdefault(h, i)
        if j != i and frames[j] == frame:
            own.append(own[j]), new.append(False)
            continue
        own.append(written + sum(new)), new.append(True)
    return own, new


@pytest.mark.parametrize("written", [0, 5, 40, 1000])
def test_dedup_equals_its_contract_with_hash_collisions(written):
    """Frames of 3 bytes in {0, 1, 2} hashed by their byte sum (weights 1): many repeats and many collisions
    (same hash, other bytes), in the window and in the batch; exact serials and new flags against the model."""
    gen = torch.Generator().manual_seed(written)
    n_ring, window, m = 24, 8, 14
    for _ in range(30):
        ring = torch.randint(0, 3, (n_ring + 1, 3), generator=gen, dtype=torch.uint8)
        frames = torch.randint(0, 3, (m, 3), generator=gen, dtype=torch.uint8)
        w = torch.ones(3, dtype=torch.int64)
        ring_hash, hashes = frame_ops.hash_frames(ring, w), frame_ops.hash_frames(frames, w)
        serial, new = frame_ops.dedup_frames(frames, hashes, ring, ring_hash, torch.tensor(written), window)
        want = _dedup_model([f.tolist() for f in frames], hashes.tolist(), [f.tolist() for f in ring],
                            ring_hash.tolist(), written, window)
        assert (serial.tolist(), new.tolist()) == want


@pytest.mark.parametrize("frame", [(3, 3), (3, 4), (4, 4), (84, 84), (96, 96)])  # (96, 96): 2 chunks
def test_compiled_gathers_equal_reference(frame):
    kd = pytest.importorskip("_kernel_devices")  # CUDA, or CPU through Triton's interpreter
    param = kd.KDEVS[0]
    if not isinstance(param, str) and any(m.name == "skip" for m in param.marks):
        pytest.skip("triton was imported without the interpreter")
    dev = param if isinstance(param, str) else param.values[0]
    from lightning_per.ext.gather import gather_rows, gather_stacks

    gen = torch.Generator().manual_seed(0)
    ring = torch.randint(0, 256, (11, *frame), dtype=torch.uint8, generator=gen).to(dev)
    positions = torch.randint(0, 11, (7, 6), dtype=torch.int32, generator=gen).to(dev)
    index = torch.tensor([6, 0, 3, 3], device=dev)
    assert torch.equal(gather_stacks(ring, positions, index), reference.gather_stacks(ring, positions, index))
    assert torch.equal(gather_rows(ring, index), ring[index])


def test_mask_slots_refuses_a_mask_of_another_shape_and_changes_nothing():
    sampler = GPUPrioritizedSampler(8, alpha=0.6, beta=0.4, device="cpu")
    sampler.update_priority(torch.arange(8), torch.ones(8), storage=None)
    before = sampler.probabilities().clone()
    for bad in (torch.ones(7, dtype=torch.bool), torch.ones(8)):
        with pytest.raises(ValueError, match=r"valid must be a \(8,\) bool tensor"):
            mask_slots(sampler.core, bad)
    assert torch.equal(sampler.probabilities(), before)
    keep = torch.tensor([True, False] * 4)
    mask_slots(sampler.core, keep)
    torch.testing.assert_close(sampler.probabilities(), keep.double() / 4)  # P(i) = 1/4 on the kept slots
