"""Recurrent DQN from prioritized slices: CartPole with the velocities hidden, solved by memory.

The agent sees only the cart position and the pole angle (CartPole-v1's observation without its two
velocities), a partially observed task: a Q-network of the current observation cannot tell a pole falling
left from one rising left. A recurrent Q-network (TorchRL's ``LSTMModule``) infers the velocities from the
recent observations. It is trained from slices of 16 consecutive transitions of one episode drawn by
:class:`lightning_per.GPUPrioritizedSliceSampler` (``slice_priority="max"``: a slice is drawn by the largest
TD error among its steps), as in DRQN (Hausknecht & Stone 2015) and R2D2 (Kapturowski et al. 2019): the
LSTM starts each slice from the hidden state stored when the step was acted (``is_init`` marks the slice
starts), the first ``--burn-in`` steps of a slice only warm it up, and the loss is the Huber loss of
double-DQN n-step targets inside the slice, weighted by the slices' importance weights; the new |TD
errors| become the steps' priorities.

The observations are divided by rough ranges (``SCALE``) so that the inputs are of order 1: one step's
change of the pole angle is then large enough for the LSTM to read the velocity from it.

Episodes are collected by ``--envs`` CartPoles stepped together and written to the replay one whole
episode at a time, so that every episode lies in consecutive slots (slices never cross an episode's end).
Each episode is followed by ``slice_len - 1`` padding steps (``"valid"`` False: no loss, no target, priority
0) so that its last steps start slices too: without them the terminal transition, the one that bounds the
Q-values, lies in one slice where a middle step lies in ``slice_len``, and the Q-values inflate.

    python examples/recurrent_dqn.py                    # LSTM, 100k env steps on the CPU
    python examples/recurrent_dqn.py --net mlp          # the same with a feed-forward Q-network
    python examples/recurrent_dqn.py --steps 3000       # smoke test

Prints one line per 20 episodes and, at the end, the mean return of the last 20 episodes.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import LSTMModule, set_recurrent_mode

from lightning_per import make_replay_buffer
from lightning_per.envs.torch_cartpole import TorchCartPoleEnv

MASKED = [0, 2]  # cart position, pole angle: the velocities (1, 3) are hidden
SCALE = torch.tensor([2.4, 3.0, 0.21, 3.0])  # rough ranges: inputs of order 1, so one step's change is visible


def q_network(kind: str, hidden: int, n_obs: int) -> TensorDictSequential:
    """``observation (.., n_obs)`` -> ``action_value (.., 2)``; the LSTM reads and writes its recurrent state."""
    embed = TensorDictModule(nn.Sequential(nn.Linear(n_obs, hidden), nn.Tanh()), ["observation"], ["embed"])
    head = TensorDictModule(nn.Linear(hidden, 2), ["features"], ["action_value"])
    if kind == "lstm":
        core = LSTMModule(hidden, hidden, in_key="embed", out_key="features")
    else:
        core = TensorDictModule(nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()), ["embed"], ["features"])
    return TensorDictSequential(embed, core, head)


def pad_episode(episode: TensorDict, tail: int) -> TensorDict:
    """One finished episode ``(L,)`` followed by ``tail`` padding steps, ``"valid"`` False on them.

    A slice never runs past a trajectory's end, so without a tail the last step of an episode lies in one
    slice of ``T`` and a middle step in ``T``: the terminal transitions, the only ones that pull the
    Q-values down, would be drawn ``T`` times less often than the others and the Q-values inflate to the
    discounted sum of an endless episode. With ``T - 1`` padding steps after it (copies of the last step,
    no reward, the episode's end moved to the last of them) every real step lies in ``T`` slices; the
    padding carries no loss, no target and priority 0.
    """
    pad = episode[-1:].expand(tail).clone()
    pad["valid"] = torch.zeros(tail, dtype=torch.bool)
    pad["reward"] = torch.zeros(tail, 1)
    pad["is_init"] = torch.zeros(tail, 1, dtype=torch.bool)
    pad["next", "done"] = torch.arange(tail).eq(tail - 1).unsqueeze(-1)
    out = torch.cat([episode, pad], 0)
    out["next", "done"][len(episode) - 1] = tail == 0
    return out


def n_step_targets(reward: torch.Tensor, terminated: torch.Tensor, q_next: torch.Tensor, real: torch.Tensor,
                   gamma: float, n: int) -> torch.Tensor:
    """n-step return targets inside slices ``(S, T)`` (every argument ``(S, T)``; ``real`` a bool prefix mask).

    ``y_t = sum_{k<h} gamma^k r_{t+k} + gamma^h (1 - terminated_{t+h-1}) Q'(s_{t+h})`` with ``h = min(n,
    real steps from t to the slice's end)`` (Sutton & Barto 2018, eq. 7.1); ``q_next[:, j]`` is the target
    value of step ``j``'s next state. Values at steps where ``real`` is False are meaningless.
    """
    S, T = reward.shape
    reward = reward * real
    left = real.sum(1, keepdim=True) - torch.arange(T)  # [S, T] real steps from t to the slice's end
    horizon = left.clamp(1, n)
    y = torch.zeros(S, T)
    for k in range(n):
        shifted = torch.nn.functional.pad(reward[:, k:], (0, k))
        y = y + (gamma ** k) * shifted * (k < horizon)
    at = (torch.arange(T) + horizon - 1).clamp(max=T - 1)  # the step whose next state bootstraps
    not_end = (~terminated).float()
    return y + (gamma ** horizon) * not_end.gather(1, at) * q_next.gather(1, at)


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--net", choices=["lstm", "mlp"], default="lstm")
    ap.add_argument("--steps", type=int, default=100_000, help="environment steps (all envs together)")
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--slices", type=int, default=32, help="slices per batch")
    ap.add_argument("--slice-len", type=int, default=16)
    ap.add_argument("--burn-in", type=int, default=4, help="first steps of a slice that only warm the LSTM up")
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--n-step", type=int, default=5, help="n of the n-step return targets (within a slice)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--target-every", type=int, default=250, help="updates between target-network copies")
    ap.add_argument("--learn-start", type=int, default=2_000, help="env steps before the first update")
    ap.add_argument("--eps-steps", type=int, default=10_000, help="env steps of the epsilon decay 1 -> 0.02")
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--observe", choices=["masked", "full"], default="masked",
                    help="masked: position and angle only (default); full: CartPole's whole state (a control)")
    ap.add_argument("--update-every", type=int, default=1, help="vector env steps per update")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true", help="print the loss and mean Q every 200 updates")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op CPU threads (docs/replay.md \"On a CPU\": 1 is fastest for the replay ops)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    VISIBLE = MASKED if a.observe == "masked" else [0, 1, 2, 3]
    torch.manual_seed(a.seed)
    E, H, T, S = a.envs, a.hidden, a.slice_len, a.slices
    recurrent = a.net == "lstm"

    env = TorchCartPoleEnv(E, seed=a.seed)
    qnet = q_network(a.net, H, len(VISIBLE))
    target = copy.deepcopy(qnet).requires_grad_(False)
    optim = torch.optim.Adam(qnet.parameters(), lr=a.lr)
    rb = make_replay_buffer(a.capacity, S * T, sampler="prioritized_slice", device="cpu", slice_len=T,
                            strict_length=False, pad_output=True, slice_priority="max", alpha=0.6, beta=0.4,
                            generator=torch.Generator().manual_seed(a.seed))

    # per-env episode buffers, written to the replay when the episode ends
    L = env.max_steps
    keys = {"observation": (len(VISIBLE),), "action": (), "reward": (1,), "is_init": (1,), "valid": (),
            ("next", "observation"): (len(VISIBLE),), ("next", "done"): (1,), ("next", "terminated"): (1,)}
    if recurrent:
        for k in ("recurrent_state_h", "recurrent_state_c"):
            keys[k] = keys[("next", k)] = (1, H)
    dtypes = {"action": torch.int64, "is_init": torch.bool, "valid": torch.bool, ("next", "done"): torch.bool,
              ("next", "terminated"): torch.bool}
    episode = TensorDict({k: torch.zeros(E, L, *shape, dtype=dtypes.get(k, torch.float32))
                          for k, shape in keys.items()}, [E, L])
    length = torch.zeros(E, dtype=torch.int64)

    state = env.reset()
    obs = state["observation"][:, VISIBLE] / SCALE[VISIBLE]
    h = torch.zeros(E, 1, H)
    c = torch.zeros(E, 1, H)
    is_init = torch.ones(E, 1, dtype=torch.bool)
    returns, ep_return = [], torch.zeros(E)
    updates, t0, step = 0, time.time(), 0
    while step < a.steps:
        # ---------------------------------------------------------------- act (epsilon-greedy)
        eps = max(0.02, 1.0 - 0.98 * step / a.eps_steps)
        with torch.no_grad():
            td = TensorDict({"observation": obs, "is_init": is_init}, [E])
            if recurrent:
                td["recurrent_state_h"], td["recurrent_state_c"] = h, c
            td = qnet(td)
        greedy = td["action_value"].argmax(-1)
        action = torch.where(torch.rand(E) < eps, torch.randint(0, 2, (E,)), greedy)
        out = env.step(state.set("action", action))["next"]
        next_obs = out["observation"][:, VISIBLE] / SCALE[VISIBLE]
        row = {"observation": obs, "action": action, "reward": out["reward"], "is_init": is_init,
               "valid": torch.ones(E, dtype=torch.bool),
               ("next", "observation"): next_obs, ("next", "done"): out["done"],
               ("next", "terminated"): out["terminated"]}
        if recurrent:
            row.update({"recurrent_state_h": h, "recurrent_state_c": c,
                        ("next", "recurrent_state_h"): td["next", "recurrent_state_h"],
                        ("next", "recurrent_state_c"): td["next", "recurrent_state_c"]})
        arange = torch.arange(E)
        for k, v in row.items():
            episode.get(k)[arange, length] = v
        length += 1
        ep_return += out["reward"].squeeze(-1)
        step += E
        done = out["done"].squeeze(-1)
        for e in torch.nonzero(done).flatten().tolist():  # whole episodes, one at a time
            slots = rb.extend(pad_episode(episode[e, : int(length[e])], T - 1))
            rb.update_priority(slots[int(length[e]):], torch.zeros(T - 1))  # padding: never drawn for itself
            returns.append(float(ep_return[e]))
            if len(returns) % 20 == 0:
                print(f"step {step:6d}  episodes {len(returns):4d}  mean return (last 20) "
                      f"{sum(returns[-20:]) / 20:6.1f}  eps {eps:.2f}  updates {updates}  "
                      f"{time.time() - t0:5.0f}s", flush=True)
        length[done], ep_return[done] = 0, 0.0
        state = env.maybe_reset(out)
        obs = state["observation"][:, VISIBLE] / SCALE[VISIBLE]
        is_init = done.unsqueeze(-1).clone()
        if recurrent:
            keep = (~done).view(E, 1, 1).float()
            h, c = td["next", "recurrent_state_h"] * keep, td["next", "recurrent_state_c"] * keep

        # ---------------------------------------------------------------- learn
        if step < a.learn_start or len(rb) < S * T or (step // E) % a.update_every:
            continue
        batch = rb.sample().reshape(S, T)
        drawn = batch["collector", "mask"]  # [S, T] False on the padding of short slices
        real = drawn & batch["valid"]  # and on the padding after an episode's end
        train = real.clone()
        train[:, : a.burn_in] = False  # warm-up steps: the LSTM state catches up, no loss
        nxt = batch["next"].select(*[k for k in ("observation", "recurrent_state_h", "recurrent_state_c")
                                     if k in batch["next"].keys()])
        first = torch.zeros(S, T, 1, dtype=torch.bool)
        first[:, 0] = True
        nxt["is_init"] = first
        cur = batch.select(*[k for k in ("observation", "is_init", "recurrent_state_h", "recurrent_state_c")
                             if k in batch.keys()])
        with set_recurrent_mode(True):
            q = qnet(cur)["action_value"].gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)  # [S, T]
            with torch.no_grad():
                best = qnet(nxt.clone())["action_value"].argmax(-1, keepdim=True)
                q_next = target(nxt)["action_value"].gather(-1, best).squeeze(-1)
        y = n_step_targets(batch["reward"].squeeze(-1), batch["next", "terminated"].squeeze(-1), q_next, real,
                           a.gamma, a.n_step)
        td_error = q - y
        w = batch["priority_weight"] * train
        loss = (nn.functional.smooth_l1_loss(q, y, reduction="none") * w).sum() / train.sum().clamp_min(1)
        optim.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(qnet.parameters(), 10.0)
        optim.step()
        rb.update_priority(batch["index"][drawn], (td_error.detach().abs() * real)[drawn])
        updates += 1
        if updates % 200 == 0 and a.verbose:
            print(f"  update {updates}: loss {loss.item():.4f}  mean Q {q.detach()[train].mean().item():.2f}  "
                  f"mean |td| {td_error.detach().abs()[train].mean().item():.3f}", flush=True)
        if updates % a.target_every == 0:
            target.load_state_dict(qnet.state_dict())
    score = sum(returns[-20:]) / max(len(returns[-20:]), 1)
    print(f"{a.net}: mean return of the last 20 episodes after {step} env steps: {score:.1f} "
          f"({len(returns)} episodes, {updates} updates, {time.time() - t0:.0f}s)")
    return score


if __name__ == "__main__":
    main()
