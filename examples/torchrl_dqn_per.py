"""TorchRL's own DQN pieces (GymEnv, collector, QValueActor, DQNLoss, SoftUpdate) with our prioritized
replay dropped in where TorchRL's ``TensorDictPrioritizedReplayBuffer`` would go.

The loss writes ``td_error`` into the sampled batch; ``rb.update_tensordict_priority(batch)`` reads it, as
with TorchRL's buffer. Storage, sampling, IS weights and priority updates stay on ``--device``.

    python examples/torchrl_dqn_per.py                      # CartPole-v1, 20k frames (~2 min on 2 CPU cores)
    python examples/torchrl_dqn_per.py --frames 2000        # smoke test
    python examples/torchrl_dqn_per.py --device cuda
"""

from __future__ import annotations

import argparse

import torch
from tensordict.nn import TensorDictSequential
from torchrl.envs import GymEnv, StepCounter, TransformedEnv
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

from lightning_per import make_replay_buffer

try:  # torchrl >= 0.12 names the single-process collector `Collector`
    from torchrl.collectors import Collector
except ImportError:  # torchrl 0.11
    from torchrl.collectors import SyncDataCollector as Collector


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=20_000, help="environment steps to collect")
    ap.add_argument("--device", default="cpu", help="replay and learner device")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)

    env = TransformedEnv(GymEnv("CartPole-v1", device="cpu"), StepCounter())
    env.set_seed(a.seed)
    n_actions = env.action_spec.space.n
    actor = QValueActor(MLP(out_features=n_actions, num_cells=[64, 64]), in_keys=["observation"],
                        spec=env.action_spec).to(device)
    explore = EGreedyModule(env.action_spec, eps_init=1.0, eps_end=0.05, annealing_num_steps=a.frames // 2)
    policy = TensorDictSequential(actor, explore)
    loss = DQNLoss(actor, action_space=env.action_spec, delay_value=True, double_dqn=True)
    loss.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss, eps=0.99)
    opt = torch.optim.Adam(loss.parameters(), lr=1e-3)

    # the one line that differs from TorchRL's DQN recipe: our buffer, on the learner's device
    rb = make_replay_buffer(50_000, 128, sampler="proportional", device=device, alpha=0.6, beta=0.4,
                            priority_key="td_error", generator=torch.Generator().manual_seed(a.seed))

    collector = Collector(env, policy, frames_per_batch=50, total_frames=a.frames, device="cpu",
                                  storing_device="cpu", policy_device=device)
    returns: list[float] = []
    for data in collector:
        done = data["next", "done"].squeeze(-1)
        returns += data["next", "step_count"][done].squeeze(-1).float().tolist()  # CartPole: return = length
        rb.extend(data.reshape(-1))
        explore.step(data.numel())
        if len(rb) < 1_000:
            continue
        for _ in range(16):  # replay ratio 1/4
            batch = rb.sample()                        # on `device`, with "index" and "priority_weight"
            out = loss(batch)                          # DQNLoss weights by "priority_weight", writes "td_error"
            opt.zero_grad()
            out["loss"].backward()
            opt.step()
            target.step()
            rb.update_tensordict_priority(batch)       # new priorities from batch["td_error"], on the device
        collector.update_policy_weights_()
    collector.shutdown()
    mean = sum(returns[-20:]) / max(len(returns[-20:]), 1)
    print(f"{a.frames} frames, {len(returns)} episodes, mean return of the last 20: {mean:.1f}")
    return mean


if __name__ == "__main__":
    main()
