"""n-step returns of a GA3C rollout against hand-computed values (A3C Algorithm S3, GA3C section 3.2)."""

import numpy as np
import pytest

from lightning_per.actors.returns import clip_rewards, nstep_returns

G = 0.9


def _run(rewards, values, bootstrap, term=None, trunc=None, gamma=G):
    r = np.asarray(rewards, dtype=np.float32).reshape(-1, 1)
    v = np.asarray(values, dtype=np.float32).reshape(-1, 1)
    z = np.zeros_like(r, dtype=bool)
    te = z.copy() if term is None else np.asarray(term, dtype=bool).reshape(-1, 1)
    tr = z.copy() if trunc is None else np.asarray(trunc, dtype=bool).reshape(-1, 1)
    return nstep_returns(r, v, np.asarray([bootstrap], dtype=np.float32), te, tr, gamma)[:, 0]


def test_no_terminal_bootstraps_from_value():
    out = _run([1.0, 0.0, 2.0], [9, 9, 9], bootstrap=10.0)
    r2 = 2.0 + G * 10.0
    r1 = 0.0 + G * r2
    r0 = 1.0 + G * r1
    np.testing.assert_allclose(out, [r0, r1, r2], rtol=1e-6)


def test_terminal_reward_is_kept_and_cuts_bootstrap():
    # episode ends at step 1 (reward 5 at the terminal step); step 2 starts a new episode.
    out = _run([1.0, 5.0, 2.0], [9, 9, 9], bootstrap=10.0, term=[0, 1, 0])
    np.testing.assert_allclose(out, [1.0 + G * 5.0, 5.0, 2.0 + G * 10.0], rtol=1e-6)


def test_terminal_at_last_step_ignores_bootstrap():
    out = _run([0.0, 0.0, 1.0], [9, 9, 9], bootstrap=100.0, term=[0, 0, 1])
    np.testing.assert_allclose(out, [G * G, G, 1.0], rtol=1e-6)


def test_truncation_bootstraps_from_value_of_that_step():
    out = _run([1.0, 1.0], [3.0, 4.0], bootstrap=50.0, trunc=[1, 0])
    np.testing.assert_allclose(out, [1.0 + G * 3.0, 1.0 + G * 50.0], rtol=1e-6)


def test_batched_envs_are_independent():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(5, 3)).astype(np.float32)
    v = rng.normal(size=(5, 3)).astype(np.float32)
    b = rng.normal(size=3).astype(np.float32)
    te = rng.random((5, 3)) < 0.3
    tr = rng.random((5, 3)) < 0.2
    out = nstep_returns(r, v, b, te, tr, G)
    for e in range(3):
        col = _run(r[:, e], v[:, e], b[e], te[:, e], tr[:, e])
        np.testing.assert_allclose(out[:, e], col, rtol=1e-6)


def test_writes_into_out():
    out = np.full((2, 1), -1.0, dtype=np.float32)
    res = nstep_returns(np.ones((2, 1)), np.zeros((2, 1)), np.zeros(1), np.zeros((2, 1), bool),
                        np.zeros((2, 1), bool), 1.0, out=out)
    assert res is out
    np.testing.assert_allclose(out[:, 0], [2.0, 1.0])


@pytest.mark.parametrize("kwargs, name", [
    (dict(values=np.zeros((3, 1))), "values"),
    (dict(bootstrap=np.zeros(2)), "bootstrap"),
    (dict(gamma=0.0), "gamma"),
])
def test_bad_inputs_name_the_argument(kwargs, name):
    args = dict(rewards=np.zeros((2, 1)), values=np.zeros((2, 1)), bootstrap=np.zeros(1),
                terminated=np.zeros((2, 1), bool), truncated=np.zeros((2, 1), bool), gamma=0.9)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        nstep_returns(**args)


def test_clip_rewards():
    np.testing.assert_array_equal(clip_rewards(np.array([-3.0, 0.5, 2.0]), 1.0), [-1.0, 0.5, 1.0])
    np.testing.assert_array_equal(clip_rewards(np.array([-3.0]), None), [-3.0])
