"""Your own LightningModule with our prioritized replay and a captured whole update, trained by ``Trainer.fit``.

Not our DQN module: a small one written the way a TorchRL user would (TorchRL's GymEnv, collector,
QValueActor, EGreedyModule, DQNLoss, SoftUpdate, LinearScheduler), with three pieces of ours:

- ``GPUPrioritizedReplayBuffer`` (through ``make_replay_buffer``): storage, sampling, IS weights and
  priority updates on the module's device;
- ``lightning_per.graphs.capture``: sample -> loss -> backward -> Adam -> target update -> priority update ->
  metrics, ``--updates-per-replay`` times over, as one CUDA-graph replay per training step (eager on CPU);
- ``AsyncMetricsCallback``: the metrics stay in device tensors (``MetricAccumulator``) and reach the logger
  (W&B, offline) once an epoch, with no host sync in the steps.

    python examples/lightning_module_per.py                       # CartPole-v1, 20k frames, CPU
    python examples/lightning_module_per.py --epochs 1 --steps-per-epoch 40   # smoke test
    python examples/lightning_module_per.py --accelerator gpu     # whole update in one CUDA graph
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from tensordict.nn import TensorDictSequential
from torch.utils.data import DataLoader
from torchrl.data.replay_buffers.scheduler import LinearScheduler
from torchrl.envs import GymEnv, StepCounter, TransformedEnv
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

from lightning_per import graphs, make_replay_buffer
from lightning_per.callbacks import AsyncMetricsCallback, make_wandb_logger
from lightning_per.metrics import MetricAccumulator

try:  # torchrl >= 0.12 names the single-process collector `Collector`
    from torchrl.collectors import Collector
except ImportError:  # torchrl 0.11
    from torchrl.collectors import SyncDataCollector as Collector


def make_env(seed: int) -> TransformedEnv:
    env = TransformedEnv(GymEnv("CartPole-v1", device="cpu"), StepCounter())
    env.set_seed(seed)
    return env


class CartPoleDQN(pl.LightningModule):
    """Double DQN on CartPole: each training step collects ``frames_per_step`` frames, then runs
    ``updates_per_step`` updates in one call of the captured update."""

    def __init__(self, frames_per_step: int = 16, updates_per_step: int = 4, steps_per_epoch: int = 125,
                 capacity: int = 50_000,
                 batch_size: int = 128, warmup_frames: int = 1_000, total_frames: int = 20_000, lr: float = 1e-3,
                 gamma: float = 0.99, tau: float = 0.01, capture: bool = True, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False  # the optimizer steps inside the captured update
        env = make_env(seed)  # for its specs; the collector gets its own (an env is no part of the model)
        spec, obs_dim = env.action_spec, env.observation_spec["observation"].shape[-1]
        env.close()
        self.actor = QValueActor(MLP(in_features=obs_dim, out_features=spec.space.n, num_cells=[64, 64]),
                                 in_keys=["observation"], spec=spec)
        self.explore = EGreedyModule(spec, eps_init=1.0, eps_end=0.05, annealing_num_steps=total_frames // 2)
        self.loss_module = DQNLoss(self.actor, action_space=spec, delay_value=True, double_dqn=True)
        self.loss_module.make_value_estimator(gamma=gamma)
        self.target = SoftUpdate(self.loss_module, tau=tau)
        self.metrics = MetricAccumulator({"loss": "mean", "td_error": "mean", "episode_return": "mean",
                                          "beta": "last", "frames": "last"}, persistent=("frames",))
        self.returns: list[float] = []  # episode returns, on the host (from the collector's CPU frames)
        self.frames = 0
        self.update = None

    def configure_optimizers(self):
        capturable = self.hparams.capture  # on a CPU the capture's eager calls step it as capturable=False
        return torch.optim.Adam(self.loss_module.parameters(), lr=self.hparams.lr, capturable=capturable)

    def setup(self, stage: str) -> None:
        h = self.hparams
        device = self.trainer.strategy.root_device if self._trainer is not None else self.device
        self.metrics.to(device)
        self.rb = make_replay_buffer(h.capacity, h.batch_size, sampler="proportional", device=device, alpha=0.6,
                                     beta=0.4, priority_key="td_error",
                                     generator=torch.Generator().manual_seed(h.seed))
        self.beta = LinearScheduler(self.rb, param_name="beta", final_value=1.0,
                                    num_steps=h.total_frames // h.frames_per_step)

    def build_update(self, optimizer) -> graphs.CapturedStep:
        """The captured update: ``updates_per_step`` updates per call (one graph replay on CUDA)."""
        raw = getattr(optimizer, "optimizer", optimizer)  # Lightning's wrapper -> torch's optimizer
        rb, loss_module, target, metrics = self.rb, self.loss_module, self.target, self.metrics

        def one_update() -> torch.Tensor:
            batch = rb.sample()
            out = loss_module(batch)
            raw.zero_grad()
            out["loss"].backward()
            raw.step()
            target.step()
            rb.update_tensordict_priority(batch)
            metrics.add("loss", out["loss"].detach())
            metrics.add("td_error", batch["td_error"].mean())
            return out["loss"].detach()

        return graphs.capture(one_update, state=[loss_module, raw, rb, target, metrics.values, metrics.counts],
                              updates_per_replay=self.hparams.updates_per_step,
                              enabled=None if self.hparams.capture else False)

    def on_train_start(self) -> None:
        h = self.hparams
        policy = TensorDictSequential(self.actor, self.explore)
        self.collector = Collector(make_env(h.seed), policy, frames_per_batch=h.frames_per_step, total_frames=-1,
                                   device="cpu", storing_device="cpu", policy_device=self.device)
        self._frames = iter(self.collector)
        self.update = self.build_update(self.optimizers())

    def train_dataloader(self):
        return DataLoader(range(self.hparams.steps_per_epoch), batch_size=None)  # one item per training step

    def training_step(self, batch, batch_idx: int) -> None:
        h = self.hparams
        data = next(self._frames)  # CPU frames of the current policy
        done = data["next", "done"].squeeze(-1)
        new = data["next", "step_count"][done].squeeze(-1).float().tolist()  # CartPole: return = length
        self.returns += new
        if new:  # host numbers: kernel arguments, no copy from the host
            self.metrics.add("episode_return", float(sum(new)), len(new))
        self.rb.extend(data.reshape(-1))
        self.explore.step(data.numel())
        self.beta.step()
        self.metrics.add("beta", self.rb.sampler.beta)
        self.frames += data.numel()
        self.metrics.add("frames", float(self.frames))
        if len(self.rb) >= h.warmup_frames:
            self.update()
            graphs.count_optimizer_step(self.optimizers(), n=h.updates_per_step)  # trainer.global_step
            self.collector.update_policy_weights_()

    def on_train_end(self) -> None:
        self.collector.shutdown()
        if self.update is not None:
            self.update.release()


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--steps-per-epoch", type=int, default=125, help="training steps (16 frames each) per epoch")
    ap.add_argument("--updates-per-replay", type=int, default=4, help="updates per training step (one replay)")
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--no-capture", action="store_true", help="plain eager updates")
    ap.add_argument("--out", default="runs/lightning_module_per", help="run directory (W&B offline files)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op CPU threads (docs/replay.md \"On a CPU\": 1 is fastest for the replay ops)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        ap.error(f"--accelerator {a.accelerator}: no CUDA device is visible (leave --accelerator cpu)")
    pl.seed_everything(a.seed, verbose=False)
    total = a.epochs * a.steps_per_epoch * 16
    model = CartPoleDQN(updates_per_step=a.updates_per_replay, steps_per_epoch=a.steps_per_epoch, total_frames=total,
                        capture=not a.no_capture, warmup_frames=min(1_000, total // 4), seed=a.seed)
    os.environ.setdefault("WANDB_SILENT", "true")
    logger = make_wandb_logger(Path(a.out), project="lightning_per-examples", name="lightning_module_per",
                               mode="offline")
    metrics = AsyncMetricsCallback(prog_bar=["loss", "episode_return"])
    trainer = pl.Trainer(accelerator=a.accelerator, devices=1, max_epochs=a.epochs, logger=logger, callbacks=[metrics],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model)
    mean = sum(model.returns[-20:]) / max(len(model.returns[-20:]), 1)
    last = metrics.history[-1] if metrics.history else {}
    print(f"{total} frames, {len(model.returns)} episodes, mean return of the last 20: {mean:.1f}, "
          f"{trainer.global_step} optimizer steps, last epoch's loss: {last.get('loss', float('nan')):.4f}")
    return mean


if __name__ == "__main__":
    main()
