"""The pieces of ``examples/recurrent_dqn.py`` that its learning depends on: the n-step targets inside a slice
(against a NumPy loop over the definition) and the padding after an episode's end (the sampler's exact start
probabilities against an enumeration of TorchRL's slice rule)."""

from __future__ import annotations

import numpy as np
import torch
from _examples import load_example
from tensordict import TensorDict

from lightning_per import make_replay_buffer

example = load_example("recurrent_dqn")


def _numpy_n_step(reward, terminated, q_next, length, gamma, n):
    """y[s, t] for t < length[s]: the n-step return of Sutton & Barto (2018, eq. 7.1), cut at the slice's end."""
    S, T = reward.shape
    y = np.full((S, T), np.nan)
    for s in range(S):
        for t in range(length[s]):
            g, k = 0.0, 0
            while k < n and t + k < length[s]:
                g += gamma ** k * reward[s, t + k]
                k += 1
            last = t + k - 1
            if not terminated[s, last]:
                g += gamma ** k * q_next[s, last]
            y[s, t] = g
    return y


def test_n_step_targets_inside_slices_match_numpy():
    rng = np.random.default_rng(0)
    S, T, gamma = 6, 9, 0.9
    length = np.array([9, 9, 5, 1, 3, 9])
    reward = rng.normal(size=(S, T)).astype(np.float32)
    q_next = rng.normal(size=(S, T)).astype(np.float32)
    terminated = np.zeros((S, T), dtype=bool)
    terminated[1, 8] = terminated[2, 4] = terminated[3, 0] = True  # slices that end with their episode
    real = np.arange(T)[None, :] < length[:, None]
    reward_padded = np.where(real, reward, 1e3)  # padding must not leak into the real steps' targets
    for n in (1, 3, 5):
        got = example.n_step_targets(torch.from_numpy(reward_padded), torch.from_numpy(terminated),
                                     torch.from_numpy(q_next), torch.from_numpy(real), gamma, n)
        want = _numpy_n_step(reward, terminated, q_next, length, gamma, n)
        np.testing.assert_allclose(got.numpy()[real], want[real], rtol=1e-5, atol=1e-5)


def _episode(L: int, terminated: bool) -> TensorDict:
    done = torch.arange(L).eq(L - 1).unsqueeze(-1)
    return TensorDict({"observation": torch.arange(L, dtype=torch.float32).unsqueeze(-1),
                       "reward": torch.ones(L, 1), "is_init": torch.arange(L).eq(0).unsqueeze(-1),
                       "valid": torch.ones(L, dtype=torch.bool),
                       ("next", "done"): done, ("next", "terminated"): done & terminated}, [L])


def _coverage(done: np.ndarray, valid: np.ndarray, T: int) -> np.ndarray:
    """P(a step is a real member of the drawn slice) under equal priorities, from TorchRL's rule: a slot
    starts a slice iff no end lies in s .. s + T - 2 (the slice fits in its trajectory)."""
    N = len(done)
    starts = [s for s in range(N - T + 1) if not done[s: s + T - 1].any()]
    cover = np.zeros(N)
    for s in starts:
        cover[s: s + T] += valid[s: s + T] / len(starts)
    return cover


def test_padding_makes_terminal_steps_as_likely_as_middle_ones():
    T, L = 4, 10
    padded = example.pad_episode(_episode(L, terminated=True), T - 1)
    assert padded.shape == (L + T - 1,)
    assert padded["valid"].tolist() == [True] * L + [False] * (T - 1)
    assert padded["next", "done"].squeeze(-1).nonzero().flatten().tolist() == [L + T - 2]  # the end moved
    assert bool(padded["next", "terminated"][L - 1]) and float(padded["reward"][L:].sum()) == 0.0
    assert torch.equal(padded["observation"][L:], padded["observation"][L - 1].expand(T - 1, 1))

    for data, terminal_share in ((padded, 1.0), (_episode(L, terminated=True), 1.0 / T)):
        rb = make_replay_buffer(64, 2 * T, sampler="prioritized_slice", device="cpu", slice_len=T,
                                strict_length=False, slice_priority="max", alpha=0.6, beta=0.4)
        rb.extend(data)
        p = rb._sampler.probabilities()[: len(data)].double()
        done = data["next", "done"].squeeze(-1).numpy()
        valid = data["valid"].numpy()
        cover = _coverage(done, valid, T)
        got = np.array([sum(float(p[s]) for s in range(max(0, j - T + 1), j + 1)) for j in range(len(data))])
        np.testing.assert_allclose(got * valid, cover, atol=1e-12)
        # the terminal step against a middle step (one with T slices over it)
        assert np.isclose(cover[L - 1] / cover[T - 1], terminal_share)
