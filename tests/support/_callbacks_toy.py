"""A toy LightningModule with a MetricAccumulator, and the values its epochs must produce (computed apart).

Data: ``arange(N_DATA)`` in batches of ``BATCH`` (no shuffle), so ``STEPS = N_DATA // BATCH`` steps an
epoch. In epoch ``e`` the step sees ``v = batch + 10 e`` and records:

- ``value_mean`` (mean of every v), ``value_sum`` (sum), ``value_max``, ``value_min``,
- ``value_last`` (mean of the epoch's last batch), ``steps`` (persistent sum of 1 per step),
- ``never`` (a mean that gets no observation: NaN).

It also finishes one "episode" per step with return ``v.mean()`` into the episode-return ring.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_per.metrics import MetricAccumulator, new_episode_ring, push_episode_returns

N_DATA, BATCH = 8, 2
STEPS = N_DATA // BATCH
KINDS = {"value_mean": "mean", "value_sum": "sum", "value_max": "max", "value_min": "min",
         "value_last": "last", "steps": "sum", "never": "mean"}


def expected_epoch(e: int) -> dict[str, float]:
    """The metrics of epoch ``e`` (0-based), by hand from the data layout."""
    vals = [float(x + 10 * e) for x in range(N_DATA)]
    last_batch = vals[-BATCH:]
    return {"value_mean": sum(vals) / len(vals), "value_sum": sum(vals), "value_max": max(vals),
            "value_min": min(vals), "value_last": sum(last_batch) / BATCH, "steps": float(STEPS * (e + 1)),
            "never": float("nan")}


def expected_episode_returns(epochs: int) -> list[float]:
    """Returns of every finished episode, oldest first (one per step)."""
    return [float(sum(range(b * BATCH, (b + 1) * BATCH)) / BATCH + 10 * e)
            for e in range(epochs) for b in range(STEPS)]


class ToyModule(pl.LightningModule):
    def __init__(self, ring_capacity: int = 100) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.metrics = MetricAccumulator(KINDS, persistent=("steps",))
        ring, count = new_episode_ring(ring_capacity)
        self.register_buffer("episode_returns_ring", ring)
        self.register_buffer("episode_returns_count", count)

    def setup(self, stage: str) -> None:
        self.metrics.to(self.device)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        v = batch.to(torch.float32) + 10.0 * self.current_epoch  # [B]
        m = self.metrics
        m.add("value_mean", v.sum(), v.numel())
        m.add("value_sum", v.sum())
        m.add("value_max", v.max())
        m.add("value_min", v.min())
        m.add("value_last", v.mean())
        m.add("steps", 1.0)
        push_episode_returns(self.episode_returns_ring, self.episode_returns_count, v.mean().reshape(1),
                             torch.ones(1, dtype=torch.bool, device=v.device))
        return self.lin(v.unsqueeze(1)).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-4)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(torch.arange(N_DATA), batch_size=BATCH, shuffle=False)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["metrics"] = self.metrics.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.metrics.load_state_dict(checkpoint["metrics"])


def trainer_kwargs(tmp_path, **kw) -> dict:
    """Quiet, fast Trainer settings for the toy runs."""
    base = dict(default_root_dir=str(tmp_path), max_epochs=3, accelerator="cpu", devices=1,
                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                log_every_n_steps=1)
    base.update(kw)
    return base
