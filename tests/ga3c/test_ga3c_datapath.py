"""GA3C data path end to end (agents -> shared memory -> predictors -> trainers -> batches), checked
against a probe environment whose observations name themselves (tests/support/_ga3c_probe_env.py): every
batch row's action must be the one the policy chose on that row's observation, its return the n-step
return recomputed forward from the environment's definition, and every reported episode the
unclipped return and length the environment defines. Several agents, several envs per agent, several
predictors batching several agents' requests, several trainers: a row permutation anywhere
(between envs, agents, steps or rollouts) fails here."""

import math
import time

import _ga3c_probe_env as probe
import pytest
import torch

from lightning_per.actors.envs import probe_env
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.system import GA3CSystem

GAMMA, CLIP, T_MAX = 0.9, 2.0, 5


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("image", [False, True], ids=["vector", "uint8-image"])
def test_batch_rows_keep_observation_action_and_return_together(image, device):
    """On CUDA the predictors pin and copy the requests on a side stream and the trainers pin batches."""
    spec = {"env": probe.ENV_ID, "backend": "gym", "kwargs": {"image": image}, "frame_stack": 4}
    cfg = GA3CConfig(env=probe.ENV_ID, env_kwargs={"image": image}, agents=3, envs_per_agent=4,
                     t_max=T_MAX, predictors=2, trainers=2, predict_batch_size=2, train_min_batch_size=40,
                     rollout_slots=3, gamma=GAMMA, reward_clip=CLIP, status_interval_s=0)
    shape, dtype, n_actions = probe_env({**spec, "num_envs": 1})
    assert n_actions == probe.N_ACTIONS
    system = GA3CSystem(cfg, spec, shape, str(dtype), probe.policy, lambda: 0, torch.device(device)).start()
    rows = []
    try:
        deadline = time.monotonic() + 120  # a guard for a loaded machine, not a wait
        # until every env instance has contributed (agents start at different times on a loaded machine)
        while (len(rows) < 1200 or len({r[0][0] for r in rows}) < 12) and time.monotonic() < deadline:
            batch = system.get_batch(timeout=5)
            if batch is None:
                continue
            assert batch["obs"].dtype == (torch.uint8 if image else torch.float32)
            assert batch["obs"].shape[1:] == shape
            assert batch["obs"].is_pinned() == (device == "cuda")
            fields = probe.decode(batch["obs"].numpy())
            rows += zip(fields.tolist(), batch["action"].tolist(), batch["ret"].tolist())
        episodes = [(ret, length) for _, _, ret, length in system.stats.episode_log]
    finally:
        system.close()
    assert len(rows) >= 1200, "the system did not deliver enough transitions"
    seen = set()
    for (uid, ep, t, n), action, ret in rows:
        assert action == probe.action_of(uid, ep, t, n), (uid, ep, t, n)
        expected = probe.expected_return(uid, ep, t, n, T_MAX, GAMMA, CLIP)
        assert math.isclose(ret, expected, rel_tol=1e-5, abs_tol=1e-5), ((uid, ep, t, n), ret, expected)
        assert (uid, n) not in seen, "a step was trained on twice"
        seen.add((uid, n))
    assert len({uid for (uid, *_), _, _ in rows}) == 12  # 3 agents x 4 envs all contributed
    # reported episodes: unclipped return and length of an episode of one of the instances; episode ep
    # of an instance starts at step n0 = the lengths of its earlier episodes (steps count from creation)
    last_ep = {}
    for (uid, ep, _, _), _, _ in rows:
        last_ep[uid] = max(ep, last_ep.get(uid, 0))
    possible = set()
    for uid, top in last_ep.items():
        n0 = 0
        for ep in range(top + 3):
            possible.add(probe.episode_result(uid, ep, n0))
            n0 += probe.episode_len(uid, ep)
    assert len(episodes) > 50
    assert any(abs(r) > CLIP for r, _ in episodes)  # raw returns, not clipped ones
    for ret, length in episodes:
        assert (ret, length) in possible, (ret, length)


def _pong_policy(obs):
    """Action from the observation alone (its newest frame), V = 0: any row mix-up shows in the batch."""
    newest = obs[:, -1].flatten(1).long()  # [N, 84*84]
    weights = torch.arange(1, newest.shape[1] + 1, device=obs.device)
    return (newest * weights).sum(1) % 6, torch.zeros(obs.shape[0], device=obs.device)


def test_pong_rollouts_keep_frames_and_actions_aligned():
    """The real backend through the whole system: each batch row's action is the one chosen on that row's
    stack, and row (t+1, e) of a rollout is the stack of row (t, e) slid by one frame (time-major rows)."""
    pytest.importorskip("ale_py")
    kwargs = {"frameskip": 4, "repeat_action_probability": 0.0, "noop_max": 30, "num_threads": 1}
    spec = {"env": "ALE/Pong-v5", "backend": "ale_vector", "kwargs": kwargs, "frame_stack": 4}
    e, t_max = 4, T_MAX
    cfg = GA3CConfig(env="ALE/Pong-v5", env_backend="ale_vector", env_kwargs=kwargs, agents=2, envs_per_agent=e,
                     t_max=t_max, predictors=2, predict_batch_size=2, train_min_batch_size=40, status_interval_s=0)
    shape, dtype, n_actions = probe_env({**spec, "num_envs": 1})
    assert (shape, str(dtype), n_actions) == ((4, 84, 84), "uint8", 6)
    system = GA3CSystem(cfg, spec, shape, str(dtype), _pong_policy, lambda: 0, torch.device("cpu")).start()
    checked = 0
    try:
        deadline = time.monotonic() + 120  # a guard for a loaded machine, not a wait
        while checked < 8 and time.monotonic() < deadline:
            batch = system.get_batch(timeout=5)
            if batch is None:
                continue
            obs = batch["obs"]
            assert obs.dtype == torch.uint8 and obs.shape[1:] == (4, 84, 84)
            torch.testing.assert_close(batch["action"], _pong_policy(obs)[0])
            for start in range(0, obs.shape[0], t_max * e):  # whole rollouts, (T, E) time-major
                roll = obs[start:start + t_max * e].view(t_max, e, 4, 84, 84)
                assert torch.equal(roll[1:, :, :3], roll[:-1, :, 1:])  # no Pong game ends this early
                assert not torch.equal(roll[1:, :, 3], roll[:-1, :, 3])
                checked += 1
    finally:
        system.close()
    assert checked >= 8
