"""A TorchRL multiprocess collector writing into our prioritized buffer while a DQN learner trains from it.

``MultiSyncCollector(..., replay_buffer=rb)`` shares the buffer and starts its workers (``spawn``); each worker
receives a ``SharedBufferWriter`` of ``rb`` (a writer handle of its own, a shared-memory ring) instead of a copy, and
``extend``s its batches through it. The learner's process owns storage, priorities and sampler: ``rb.sample()``
ingests what the workers made ready, then draws. Workers never hold the storage and never touch CUDA, so ``--device
cuda`` keeps the replay on the GPU with CPU workers. ``--samples-per-insert R`` caps the learner at R sampled
transitions per transition written (TorchRL 0.15's rate limit; ``sample(wait=True)`` waits for the workers).

    python examples/collector_writers.py                                  # CartPole-v1, 2 workers, 6k frames
    python examples/collector_writers.py --frames 1280 --learning-starts 256   # smoke test
    python examples/collector_writers.py --device cuda --workers 4 --samples-per-insert 8
"""

from __future__ import annotations

import argparse

import torch
from tensordict.nn import TensorDictSequential
from torchrl.collectors import MultiSyncCollector
from torchrl.envs import GymEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

from lightning_per import make_replay_buffer


def make_env() -> GymEnv:
    return GymEnv("CartPole-v1", device="cpu")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=6_000, help="environment steps the workers collect in all")
    ap.add_argument("--workers", type=int, default=2, help="collector worker processes")
    ap.add_argument("--frames-per-batch", type=int, default=128, help="frames a collector iteration (all workers)")
    ap.add_argument("--updates-per-batch", type=int, default=16, help="learner updates a collector iteration")
    ap.add_argument("--learning-starts", type=int, default=512, help="transitions stored before the first update")
    ap.add_argument("--samples-per-insert", type=float, default=None, help="rate limit: sampled per written")
    ap.add_argument("--device", default="cpu", help="replay and learner device")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if torch.device(a.device).type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: no CUDA device is visible (leave --device cpu)")
    torch.manual_seed(a.seed)
    device, batch_size = torch.device(a.device), 64

    env = make_env()
    actor = QValueActor(MLP(in_features=env.observation_spec["observation"].shape[-1],
                            out_features=env.action_spec.space.n, num_cells=[64, 64]),
                        in_keys=["observation"], spec=env.action_spec)  # the workers' copy acts on the CPU
    explore = EGreedyModule(env.action_spec, eps_init=1.0, eps_end=0.05, annealing_num_steps=a.frames // 2)
    learner_actor = QValueActor(MLP(in_features=env.observation_spec["observation"].shape[-1],
                                    out_features=env.action_spec.space.n, num_cells=[64, 64], device=device),
                                in_keys=["observation"], spec=env.action_spec.to(device))
    learner_actor.load_state_dict(actor.state_dict())
    loss = DQNLoss(learner_actor, action_space=env.action_spec, delay_value=True, double_dqn=True)
    loss.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss, tau=0.01)
    optimizer = torch.optim.Adam(loss.parameters(), lr=1e-3)

    rb = make_replay_buffer(50_000, batch_size, device=device, alpha=0.6, beta=0.4, priority_key="td_error",
                            samples_per_insert=a.samples_per_insert)
    collector = MultiSyncCollector([make_env] * a.workers, TensorDictSequential(actor, explore),
                                   frames_per_batch=a.frames_per_batch, total_frames=a.frames, replay_buffer=rb)
    updates = 0
    try:
        for _ in collector:                          # None: the workers wrote their batches into rb
            explore.step(a.frames_per_batch)
            if len(rb) < a.learning_starts:          # len() ingests what the workers made ready
                continue
            for _ in range(a.updates_per_batch):
                batch = rb.sample(wait=a.samples_per_insert is not None, timeout=60.0)
                out = loss(batch)                    # weights by "priority_weight", writes "td_error"
                optimizer.zero_grad()
                out["loss"].backward()
                optimizer.step()
                target.step()
                rb.update_tensordict_priority(batch)
                updates += 1
            actor.load_state_dict({k: v.cpu() for k, v in learner_actor.state_dict().items()})
            collector.update_policy_weights_()        # the workers act with the new weights
    finally:
        collector.shutdown()
    rb.ingest()
    stats = rb.ingress_stats
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        greedy = env.rollout(500, learner_actor.to("cpu"))
    ret = float(greedy["next", "reward"].sum())
    print(f"{a.frames} frames, {stats.ingested} transitions ingested from {stats.writers} workers "
          f"({stats.dropped} dropped), {updates} updates, greedy return {ret:.1f}")
    rb.close_writers()
    return {"ingested": stats.ingested, "writers": stats.writers, "updates": updates, "return": ret}


if __name__ == "__main__":
    main()
