"""The dead-unit fraction GA3C logs (`dead_unit_frac`): the share of the last hidden layer's ReLU units that no
transition of a batch activates (Sokar et al. 2023, tau-dormant with tau = 0), against NumPy; the networks'
features/heads split against their forward; a real run's logged mean against NumPy's count on each update's batch."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lightning_per.actors.envs import TOY_ENV_ID
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.module import GA3C
from lightning_per.ga3c.networks import A3CConvNet, MinAtarConvNet, MLPActorCritic, dead_unit_fraction


def _numpy_dead(h: np.ndarray) -> float:
    """Sokar et al.'s score s_i = mean_x |h_i(x)| / mean_k mean_x |h_k(x)|; dead: s_i <= 0, i.e. h_i = 0 on all x."""
    score = np.abs(h).mean(axis=0)
    return float(np.mean(score <= 0.0))


def test_dead_unit_fraction_of_hand_made_activations():
    h = torch.tensor([[0.0, 1.0, 0.0, 2.0, 0.0],
                      [0.0, 0.0, 0.0, 3.0, 0.5],
                      [0.0, 5.0, 0.0, 0.0, 0.0]])
    assert float(dead_unit_fraction(h)) == pytest.approx(2 / 5)  # units 0 and 2
    assert float(dead_unit_fraction(h[:1])) == pytest.approx(3 / 5)  # one row: units 0, 2 and 4
    assert float(dead_unit_fraction(torch.zeros(4, 8))) == 1.0
    assert float(dead_unit_fraction(torch.ones(1, 8))) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_dead_unit_fraction_matches_numpy_on_relu_activations(seed):
    rng = np.random.default_rng(seed)
    n, width = int(rng.integers(1, 40)), int(rng.integers(1, 300))
    pre = rng.normal(size=(n, width)) - rng.uniform(0.0, 3.0, size=width)  # some units negative on most rows
    h = np.maximum(pre, 0.0)
    got = dead_unit_fraction(torch.from_numpy(h).float())
    assert got.dtype == torch.float32 and got.shape == ()
    assert float(got) == pytest.approx(_numpy_dead(h), abs=1e-7)


@pytest.mark.parametrize("shape", [(5,), (0, 4), (3, 0), (2, 3, 4)])
def test_dead_unit_fraction_refuses_what_is_not_n_by_h(shape):
    with pytest.raises(ValueError, match=r"^h must be \(N, H\)"):
        dead_unit_fraction(torch.zeros(shape))


@pytest.mark.parametrize("net, obs", [
    (A3CConvNet(4, 6), torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)),
    (MinAtarConvNet(4, 3), torch.rand(3, 10, 10, 4) > 0.7),
    (MLPActorCritic(4, 2, (16, 8)), torch.randn(3, 4)),
])
def test_heads_of_the_features_are_the_forward(net, obs):
    torch.manual_seed(0)
    with torch.no_grad():
        h = net.features(obs)
        logits, value = net.heads(h)
        want_logits, want_value = net(obs)
    assert h.dim() == 2 and h.shape[0] == 3 and bool((h >= 0).all())  # after the ReLU
    assert torch.equal(logits, want_logits) and torch.equal(value, want_value)


class _Recording(GA3C):
    """Counts, in NumPy, each update's dead units on its batch from the network as the update sees it."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.dead = []

    def training_step(self, batch, batch_idx):
        with torch.no_grad():
            h = self.net.features(batch["obs"]).double().numpy()
        self.dead.append(_numpy_dead(h))
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("vtrace", [False, True])
def test_a_run_logs_the_mean_of_each_updates_dead_units(vtrace):
    # with V-trace the update's forward also holds the rollouts' s_T: only the batch's own observations count
    cfg = GA3CConfig(env=TOY_ENV_ID, agents=2, envs_per_agent=2, t_max=3, train_min_batch_size=12, hidden_sizes=[16],
                     max_updates=12, updates_per_epoch=6, max_time_s=60, status_interval_s=0, device="cpu",
                     vtrace=vtrace)
    model = _Recording(cfg)
    with torch.no_grad():  # 5 of the 16 units can never fire: a bias far below any weighted input
        model.net.trunk[0].bias[:5] = -1e6
    pl.Trainer(accelerator="cpu", devices=1, max_epochs=-1, logger=False, enable_progress_bar=False,
               enable_checkpointing=False, enable_model_summary=False).fit(model)
    assert len(model.dead) == 12
    assert min(model.dead) >= 5 / 16  # the 5 stay dead: no gradient reaches them
    # no callback here resets the metrics between epochs: the logged value is the mean over all 12 updates
    assert float(model.metrics.compute()["dead_unit_frac"]) == pytest.approx(np.mean(model.dead), abs=1e-6)
