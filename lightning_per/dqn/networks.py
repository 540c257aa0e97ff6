"""Q-networks: an MLP for state vectors, the Nature CNN for stacked frames, an optional dueling head.

References: Mnih et al. 2015 (Nature 518, methods: three convolutions 32x8x8/4, 64x4x4/2,
64x3x3/1, then 512 units), Wang et al. 2016 (arXiv:1511.06581, dueling architecture,
``Q = V + A - mean_a A``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["MLPTorso", "NatureCNNTorso", "QNetwork", "make_q_network"]


class MLPTorso(nn.Module):
    """``(B, D) float -> (B, hidden_sizes[-1]) float32`` with ReLU after every layer."""

    def __init__(self, in_features: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for width in hidden_sizes:
            layers += [nn.Linear(in_features, width), nn.ReLU()]
            in_features = width
        self.net = nn.Sequential(*layers)
        self.out_features = in_features

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs.flatten(1).to(torch.float32))


class NatureCNNTorso(nn.Module):
    """``(B, C, 84, 84) uint8 (0..255) -> (B, 512) float32`` (Mnih et al. 2015); input scaled by 1/255."""

    def __init__(self, in_channels: int, frame_size: int = 84, hidden: int = 512) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            n_flat = self.conv(torch.zeros(1, in_channels, frame_size, frame_size)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n_flat, hidden), nn.ReLU())
        self.out_features = hidden

    def forward(self, obs: Tensor) -> Tensor:
        x = obs.to(torch.float32) / 255.0
        if self.conv[0].weight.is_contiguous(memory_format=torch.channels_last):
            x = x.contiguous(memory_format=torch.channels_last)  # the layout of the NHWC conv kernels
        return self.fc(self.conv(x))


class QNetwork(nn.Module):
    """Torso + head: ``observation -> (B, n_actions) float32`` action values.

    Args:
        torso: a module with attribute ``out_features``.
        n_actions: number of discrete actions A.
        dueling: if True, ``Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')`` (Wang et al. 2016, eq. 9).
    """

    def __init__(self, torso: nn.Module, n_actions: int, dueling: bool = False) -> None:
        super().__init__()
        self.torso, self.dueling = torso, dueling
        width = torso.out_features
        self.advantage = nn.Linear(width, n_actions)
        self.value = nn.Linear(width, 1) if dueling else None

    def forward(self, obs: Tensor) -> Tensor:
        h = self.torso(obs)  # [B, H]
        adv = self.advantage(h)  # [B, A]
        if self.value is None:
            return adv
        return self.value(h) + adv - adv.mean(-1, keepdim=True)  # [B, A]


def make_q_network(kind: str, obs_shape: Sequence[int], n_actions: int,
                   hidden_sizes: Sequence[int] = (256, 256), dueling: bool = False) -> QNetwork:
    """Build a Q-network.

    Args:
        kind: ``"mlp"`` (any observation, flattened) or ``"nature_cnn"`` (``(C, H, H)`` frames).
        obs_shape: one observation's shape (no batch dimension).
        n_actions: number of discrete actions.
        hidden_sizes: MLP widths; for ``nature_cnn`` the last entry is the fully connected width.
        dueling: dueling head (Wang et al. 2016).

    Raises:
        ValueError: unknown ``kind``, empty/non-positive ``hidden_sizes``, ``n_actions < 1``, or a
            ``nature_cnn`` observation that is not ``(C, H, H)``.
    """
    if n_actions < 1:
        raise ValueError(f"n_actions must be >= 1, got {n_actions}")
    if len(hidden_sizes) == 0 or any(int(w) < 1 for w in hidden_sizes):
        raise ValueError(f"hidden_sizes must be a non-empty list of positive widths, "
                         f"got {list(hidden_sizes)}")
    if kind == "mlp":
        n_in = 1
        for s in obs_shape:
            n_in *= int(s)
        torso: nn.Module = MLPTorso(n_in, [int(w) for w in hidden_sizes])
    elif kind == "nature_cnn":
        if len(obs_shape) != 3 or obs_shape[1] != obs_shape[2]:
            raise ValueError(f"network='nature_cnn' needs (C, H, H) observations, got {tuple(obs_shape)}")
        torso = NatureCNNTorso(int(obs_shape[0]), int(obs_shape[1]), hidden=int(hidden_sizes[-1]))
    else:
        raise ValueError(f"network must be 'mlp' or 'nature_cnn', got {kind!r}")
    return QNetwork(torso, n_actions, dueling)
