"""Policy/value networks: one trunk, two heads (A3C, Mnih et al. 2016; GA3C section 3.2).

Each network splits its ``forward`` into ``features(obs) -> h`` (N, H), the last hidden layer after its ReLU, and
``heads(h) -> (logits (N, A), value (N,))``, so that the learner can watch the units of ``h``
(:func:`dead_unit_fraction`) without a second forward.

Every network holds ``obs_loc``, a buffer of the observation's shape in its units (pixels 0-255 for uint8 frames),
subtracted from each observation before any scaling: TorchRL's ``ObservationNorm`` location, zeros unless set
(``GA3CConfig.obs_center_steps`` fills it with the mean observation of random play,
:func:`lightning_per.actors.envs.mean_observation`). It is part of the ``state_dict``, so a checkpoint carries it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["MLPActorCritic", "A3CConvNet", "MinAtarConvNet", "dead_unit_fraction", "make_network"]


class MLPActorCritic(nn.Module):
    """MLP trunk (ReLU) with a policy-logits head and a value head, for vector observations.

    Args:
        obs_dim: flattened observation size.
        n_actions: number of discrete actions A.
        hidden_sizes: widths of the hidden layers.

    Input (N, *obs_shape) float; outputs ``(logits (N, A), value (N,))`` on the input's device.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int] = (128, 128)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for h in hidden_sizes:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.policy = nn.Linear(width, n_actions)
        self.value = nn.Linear(width, 1)
        nn.init.orthogonal_(self.policy.weight, gain=0.01)  # near-uniform initial policy
        nn.init.zeros_(self.policy.bias)
        self.register_buffer("obs_loc", torch.zeros(obs_dim))  # [obs_dim], subtracted from each observation

    def features(self, obs: Tensor) -> Tensor:
        """The last hidden layer after its ReLU: (N, H) float32."""
        return self.trunk(obs.flatten(1).float() - self.obs_loc)  # [N, H]

    def heads(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``(logits (N, A), value (N,))`` of the features ``h`` (N, H)."""
        return self.policy(h), self.value(h).squeeze(-1)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return self.heads(self.features(obs))


class A3CConvNet(nn.Module):
    """The A3C / GA3C Atari net: conv 16x8x8 stride 4, conv 32x4x4 stride 2, FC 256 (ReLU).

    Args:
        in_channels: stacked frames C (4).
        n_actions: number of discrete actions A.
        image_size: square input side (84).

    Input (N, C, 84, 84) uint8 pixels (scaled by 1/255 here, on the model's device) or float in
    [0, 1]; outputs ``(logits (N, A), value (N,))``.

    Initialisation as in A2C on Atari (OpenAI baselines, whose optimiser settings
    ``configs/ga3c_pong.yaml`` uses): orthogonal weights with gain sqrt(2) for the ReLU layers, 0.01
    for the policy head (a near-uniform initial policy) and 1 for the value head, zero biases. With
    torch's default init the gradients of the batch-mean loss on Pong frames are 10-20x smaller
    (0.5-2.5e-4 rms in the conv/FC weights), far below the sqrt(eps) = 3e-3 floor of RMSProp-TF with
    eps 1e-5, so those weights moved at 1-8% of the learning rate per update.
    """

    def __init__(self, in_channels: int, n_actions: int, image_size: int = 84) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Conv2d(in_channels, 16, 8, stride=4), nn.ReLU(),
            nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.trunk(torch.zeros(1, in_channels, image_size, image_size)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, 256), nn.ReLU())
        self.policy = nn.Linear(256, n_actions)
        self.value = nn.Linear(256, 1)
        for layer, gain in ((self.trunk[0], 2**0.5), (self.trunk[2], 2**0.5), (self.fc[0], 2**0.5),
                            (self.policy, 0.01), (self.value, 1.0)):
            nn.init.orthogonal_(layer.weight, gain=gain)
            nn.init.zeros_(layer.bias)
        # [C, H, W] pixels, subtracted before the scaling (the module docstring)
        self.register_buffer("obs_loc", torch.zeros(in_channels, image_size, image_size))

    def features(self, obs: Tensor) -> Tensor:
        """The FC layer after its ReLU: (N, 256) float32."""
        x = (obs.float() - self.obs_loc) / 255.0 if obs.dtype == torch.uint8 else obs - self.obs_loc  # [N, C, H, W]
        return self.fc(self.trunk(x))  # [N, 256]

    def heads(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``(logits (N, A), value (N,))`` of the features ``h`` (N, 256)."""
        return self.policy(h), self.value(h).squeeze(-1)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return self.heads(self.features(obs))


class MinAtarConvNet(nn.Module):
    """The MinAtar network (Young & Tian 2019, arXiv:1903.03176, section 4): conv 16x3x3 stride 1, FC 128 (ReLU).

    Args:
        in_channels: the game's object channels C (Breakout 4, SpaceInvaders 6, ...).
        n_actions: number of discrete actions A.
        image_size: square input side (10).

    Input (N, H, W, C), MinAtar's channels-last layout, bool or float in {0, 1} (cast to float32 here, on the
    model's device); outputs ``(logits (N, A), value (N,))``. Initialisation as :class:`A3CConvNet`
    (orthogonal, gain sqrt(2) for the ReLU layers, 0.01 for the policy head, 1 for the value head, zero biases).

    Raises:
        ValueError: ``in_channels``, ``n_actions`` or ``image_size`` below 1.

    Example::

        >>> import torch
        >>> net = MinAtarConvNet(4, 3)
        >>> logits, value = net(torch.zeros(2, 10, 10, 4, dtype=torch.bool))
        >>> tuple(logits.shape), tuple(value.shape)
        ((2, 3), (2,))
    """

    def __init__(self, in_channels: int, n_actions: int, image_size: int = 10) -> None:
        super().__init__()
        for name, v in (("in_channels", in_channels), ("n_actions", n_actions), ("image_size", image_size)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        self.conv = nn.Conv2d(in_channels, 16, 3, stride=1)
        side = image_size - 2
        self.fc = nn.Linear(16 * side * side, 128)
        self.policy = nn.Linear(128, n_actions)
        self.value = nn.Linear(128, 1)
        for layer, gain in ((self.conv, 2**0.5), (self.fc, 2**0.5), (self.policy, 0.01), (self.value, 1.0)):
            nn.init.orthogonal_(layer.weight, gain=gain)
            nn.init.zeros_(layer.bias)
        self.register_buffer("obs_loc", torch.zeros(image_size, image_size, in_channels))  # [H, W, C]

    def features(self, obs: Tensor) -> Tensor:
        """The FC layer after its ReLU: (N, 128) float32."""
        x = (obs.float() - self.obs_loc).permute(0, 3, 1, 2)  # [N, C, H, W]
        return torch.relu(self.fc(torch.relu(self.conv(x)).flatten(1)))  # [N, 128]

    def heads(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``(logits (N, A), value (N,))`` of the features ``h`` (N, 128)."""
        return self.policy(h), self.value(h).squeeze(-1)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return self.heads(self.features(obs))


def dead_unit_fraction(h: Tensor) -> Tensor:
    """The share of the units of ``h`` that are 0 on every row: ReLU units that no input of the batch activates.

    A unit i is tau-dormant when its mean |activation| over the inputs, divided by the layer's mean over its
    units, is <= tau (Sokar et al. 2023, "The Dormant Neuron Phenomenon in Deep Reinforcement Learning", ICML,
    definition 3.1); this is tau = 0, the units that pass no gradient to the weights before them on this batch.
    A trunk whose units all die leaves the heads a constant input: a policy and value that no longer depend on
    the state. Tensor ops only (no host read), so it can be part of a captured update.

    Args:
        h: (N, H) activations after a ReLU, N >= 1 rows, any float dtype and device.

    Returns:
        0-d float32 tensor on ``h``'s device, in [0, 1].

    Raises:
        ValueError: ``h`` is not 2-D with at least one row and one unit.

    Example::

        >>> dead_unit_fraction(torch.tensor([[0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 0.0, 3.0]]))
        tensor(0.5000)
    """
    if h.dim() != 2 or h.shape[0] < 1 or h.shape[1] < 1:
        raise ValueError(f"h must be (N, H) with N, H >= 1, got shape {tuple(h.shape)}")
    return (h > 0).any(dim=0).logical_not().float().mean()


def make_network(kind: str, obs_shape: Sequence[int], n_actions: int,
                 hidden_sizes: Sequence[int] = (128, 128)) -> nn.Module:
    """The policy/value network of ``kind`` for observations of ``obs_shape`` and ``n_actions`` actions.

    ``conv`` (:class:`A3CConvNet`) for (C, H, H) Atari frame stacks, ``minatar`` (:class:`MinAtarConvNet`) for
    MinAtar's (H, H, C) channels-last frames, ``mlp`` (:class:`MLPActorCritic`, ``hidden_sizes``) for anything;
    ``auto`` picks ``conv`` for (C, H, H), ``minatar`` for (H, H, C) with C != H, ``mlp`` otherwise.

    Raises:
        ValueError: ``conv`` with an observation that is not (C, H, H), ``minatar`` with one that is not
            (H, H, C), or an unknown kind.

    Example::

        >>> type(make_network("auto", (10, 10, 4), 3)).__name__
        'MinAtarConvNet'
    """
    if kind == "auto":
        image = len(obs_shape) == 3
        kind = ("conv" if image and obs_shape[1] == obs_shape[2] else
                "minatar" if image and obs_shape[0] == obs_shape[1] else "mlp")
    if kind == "mlp":
        obs_dim = 1
        for d in obs_shape:
            obs_dim *= int(d)
        return MLPActorCritic(obs_dim, n_actions, hidden_sizes)
    if kind == "conv":
        if len(obs_shape) != 3 or obs_shape[1] != obs_shape[2]:
            raise ValueError(f"network='conv' needs (C, H, H) observations, got {tuple(obs_shape)}")
        return A3CConvNet(int(obs_shape[0]), n_actions, int(obs_shape[1]))
    if kind == "minatar":
        if len(obs_shape) != 3 or obs_shape[0] != obs_shape[1]:
            raise ValueError(f"network='minatar' needs (H, H, C) observations, got {tuple(obs_shape)}")
        return MinAtarConvNet(int(obs_shape[2]), n_actions, int(obs_shape[0]))
    raise ValueError(f"network must be 'auto', 'mlp', 'conv' or 'minatar', got {kind!r}")
