"""TorchRL's own DQN pieces (GymEnv, collector, QValueActor, EGreedyModule, DQNLoss, SoftUpdate) with our
prioritized replay dropped in where TorchRL's ``TensorDictPrioritizedReplayBuffer`` would go.

The loss writes ``td_error`` into the sampled batch; ``rb.update_tensordict_priority(batch)`` reads it, as
with TorchRL's buffer. Storage, sampling, IS weights and priority updates stay on ``--device``; TorchRL's
``LinearScheduler`` anneals the IS exponent beta. ``--capture`` records the whole update (sample, loss,
backward, Adam, target update, priority update), ``--updates-per-replay`` times over, in one CUDA graph
(``lightning_per.graphs.capture``; eager on CPU); ``--compile`` also compiles the loss (``torch.compile``,
inside the graph); ``--hard-update N`` copies the target network every N + 1 updates with
``lightning_per.graphs.HardUpdate`` (TorchRL's schedule on a device counter) instead of the Polyak average.

    python examples/torchrl_dqn_per.py                                   # CartPole-v1, 20k frames, CPU
    python examples/torchrl_dqn_per.py --frames 600 --learning-starts 200  # smoke test
    python examples/torchrl_dqn_per.py --device cuda --capture           # whole update in one CUDA graph
    python examples/torchrl_dqn_per.py --device cuda --capture --compile
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictSequential
from torchrl.data.replay_buffers.scheduler import LinearScheduler
from torchrl.envs import GymEnv, StepCounter, TransformedEnv
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

from lightning_per import graphs, make_replay_buffer

try:  # torchrl >= 0.12 names the single-process collector `Collector`
    from torchrl.collectors import Collector
except ImportError:  # torchrl 0.11
    from torchrl.collectors import SyncDataCollector as Collector


@dataclass
class Learner:
    """The pieces of one DQN learner and its update (``update()`` runs ``updates_per_replay`` updates)."""

    actor: QValueActor
    loss: DQNLoss
    target: SoftUpdate | graphs.HardUpdate
    optimizer: torch.optim.Adam
    rb: object
    update: graphs.CapturedStep


def make_learner(obs_dim: int, action_spec, *, device, capacity: int = 50_000, batch_size: int = 128, hidden=(64, 64),
                 lr: float = 1e-3, gamma: float = 0.99, tau: float = 0.01, hard_update: int | None = None,
                 capture: bool = False, compile_loss: bool = False, updates_per_replay: int = 8,
                 seed: int = 0) -> Learner:
    """TorchRL's DQN learner on our buffer; ``capture``: the whole update as one CUDA graph (eager on CPU)."""
    device = torch.device(device)
    actor = QValueActor(MLP(in_features=obs_dim, out_features=action_spec.space.n, num_cells=list(hidden),
                            device=device), in_keys=["observation"], spec=action_spec.to(device))
    loss = DQNLoss(actor, action_space=action_spec, delay_value=True, double_dqn=True)
    loss.make_value_estimator(gamma=gamma)
    target = (graphs.HardUpdate(loss, value_network_update_interval=hard_update) if hard_update is not None
              else SoftUpdate(loss, tau=tau))
    # capturable=True: Adam's step count lives on the device, so the graph advances it (on a CPU, where torch has
    # no capturable step, the capture's eager calls step it as capturable=False)
    optimizer = torch.optim.Adam(loss.parameters(), lr=lr, capturable=capture)
    # the one line that differs from TorchRL's DQN recipe: our buffer, on the learner's device
    rb = make_replay_buffer(capacity, batch_size, sampler="proportional", device=device, alpha=0.6, beta=0.4,
                            priority_key="td_error", generator=torch.Generator().manual_seed(seed))
    loss_fn = torch.compile(loss) if compile_loss else loss

    def one_update() -> torch.Tensor:
        batch = rb.sample()                        # on `device`, with "index" and "priority_weight"
        out = loss_fn(batch)                       # DQNLoss weights by "priority_weight", writes "td_error"
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        target.step()
        rb.update_tensordict_priority(batch)       # new priorities from batch["td_error"], on the device
        return out["loss"].detach()

    # state: what the update changes (the capture's warm-up is rolled back on all of it)
    update = graphs.capture(one_update, state=[loss, optimizer, rb, target], updates_per_replay=updates_per_replay,
                            enabled=None if capture else False)
    return Learner(actor, loss, target, optimizer, rb, update)


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=20_000, help="environment steps to collect")
    ap.add_argument("--device", default="cpu", help="replay and learner device")
    ap.add_argument("--capture", action="store_true", help="the whole update in one CUDA graph (eager on CPU)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the loss (inside the graph)")
    ap.add_argument("--updates-per-replay", type=int, default=8, help="updates per call (per graph replay)")
    ap.add_argument("--hard-update", type=int, default=None, metavar="N",
                    help="copy the target network every N + 1 updates instead of the Polyak average")
    ap.add_argument("--learning-starts", type=int, default=1_000, help="transitions stored before the first update")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op CPU threads (docs/replay.md \"On a CPU\": 1 is fastest for the replay ops)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if torch.device(a.device).type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: no CUDA device is visible (leave --device cpu)")
    torch.manual_seed(a.seed)
    device = torch.device(a.device)

    env = TransformedEnv(GymEnv("CartPole-v1", device="cpu"), StepCounter())
    env.set_seed(a.seed)
    obs_dim = env.observation_spec["observation"].shape[-1]
    learner = make_learner(obs_dim, env.action_spec, device=device, hard_update=a.hard_update, capture=a.capture,
                           compile_loss=a.compile, updates_per_replay=a.updates_per_replay, seed=a.seed)
    explore = EGreedyModule(env.action_spec, eps_init=1.0, eps_end=0.05,
                            annealing_num_steps=a.frames // 2).to(device)  # epsilon beside the actor's actions
    policy = TensorDictSequential(learner.actor, explore)
    frames_per_batch, updates_per_batch = 50, 16  # replay ratio 1/4 (over the learner's device batches)
    calls = max(updates_per_batch // a.updates_per_replay, 1)
    beta = LinearScheduler(learner.rb, param_name="beta", final_value=1.0, num_steps=a.frames // frames_per_batch)

    collector = Collector(env, policy, frames_per_batch=frames_per_batch, total_frames=a.frames, device="cpu",
                          storing_device="cpu", policy_device=device)
    returns: list[float] = []
    for data in collector:
        done = data["next", "done"].squeeze(-1)
        returns += data["next", "step_count"][done].squeeze(-1).float().tolist()  # CartPole: return = length
        learner.rb.extend(data.reshape(-1))
        explore.step(data.numel())
        beta.step()                                    # host float -> the sampler's device scalar (no sync)
        if len(learner.rb) < a.learning_starts:
            continue
        for _ in range(calls):
            learner.update()                           # updates_per_replay updates: one graph replay
        collector.update_policy_weights_()
    collector.shutdown()
    mean = sum(returns[-20:]) / max(len(returns[-20:]), 1)
    print(f"{a.frames} frames, {len(returns)} episodes, mean return of the last 20: {mean:.1f}")
    return mean


if __name__ == "__main__":
    main()
