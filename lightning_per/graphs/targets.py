"""Target-network updaters that can run inside a CUDA graph: :class:`HardUpdate`.

TorchRL's ``SoftUpdate`` is capturable as it is (one in-place ``lerp_`` per parameter); its ``HardUpdate``
is not: it decides on a Python step counter, which a graph freezes (every replay would copy, or none).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from torchrl.objectives.utils import TargetNetUpdater

__all__ = ["HardUpdate"]


class HardUpdate(TargetNetUpdater):
    """TorchRL's ``HardUpdate`` schedule with its step counter on the device, so ``step()`` can be captured.

    Same arguments and the same copies as :class:`torchrl.objectives.HardUpdate`: the counter starts at 0,
    ``step()`` copies the online parameters into the target ones when the counter equals
    ``value_network_update_interval`` (then resets it to 0), else increments it; so the copies happen at the
    ``(interval + 1)``-th call and every ``interval + 1`` calls after. Here the counter is a ``() int64`` tensor
    on the loss module's device and the copy is ``target = where(counter == interval, source, target)``: no host
    read, the same kernels every call (each call reads and writes every target parameter, copy or not).

    Args:
        loss_module: a TorchRL loss with target parameters (e.g. ``DQNLoss(..., delay_value=True)``).
        value_network_update_interval: calls between copies, as TorchRL's (an int >= 0).

    Raises:
        ValueError: ``value_network_update_interval`` is not an int >= 0 (and TorchRL's own checks of the loss).

    Example:
        >>> from torchrl.modules import MLP, QValueActor
        >>> from torchrl.objectives import DQNLoss
        >>> from torchrl.data import Categorical
        >>> from lightning_per.graphs import HardUpdate
        >>> actor = QValueActor(MLP(out_features=2, num_cells=[8]), in_keys=["observation"], spec=Categorical(2))
        >>> loss = DQNLoss(actor, action_space="categorical", delay_value=True)
        >>> target = HardUpdate(loss, value_network_update_interval=100)
        >>> target.step()  # capturable: graphs.capture(..., state=[loss, target, ...])
    """

    def __init__(self, loss_module, *, value_network_update_interval: int = 1000) -> None:
        interval = value_network_update_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
            raise ValueError(f"value_network_update_interval must be an int >= 0, got {interval!r}")
        super().__init__(loss_module)
        self.value_network_update_interval = interval
        device = next((t.device for t in loss_module.parameters()), torch.device("cpu"))
        #: the schedule's counter, ``() int64`` on the loss module's device: the tensor :meth:`step` writes besides
        #: the target parameters (a capture restores it after its warm-up)
        self.step_count = torch.zeros((), dtype=torch.int64, device=device)

    @torch.no_grad()
    def step(self) -> None:
        """One call of the schedule (see the class docstring); no host sync."""
        self._copy = self.step_count == self.value_network_update_interval  # () bool, read by _step
        super().step()
        self.step_count.copy_(torch.where(self._copy, torch.zeros_like(self.step_count), self.step_count + 1))

    def _step(self, p_source, p_target) -> None:
        pairs = [(p_source, p_target)] if isinstance(p_source, Tensor) else [
            (source, p_target.get(key)) for key, source in p_source.items(True, True)]
        for source, target in pairs:
            target.data.copy_(torch.where(self._copy, source.data, target.data))

    def state_dict(self) -> dict[str, Any]:
        """``initialized`` and the counter (a device tensor, copied: no host read)."""
        return {"initialized": self.initialized, "step_count": self.step_count.clone()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` in place (a captured graph keeps reading the same counter); also takes
        TorchRL's ``HardUpdate.state_dict()`` (its host ``counter``)."""
        self.initialized = state_dict.get("initialized", self.initialized)
        count = state_dict.get("step_count", state_dict.get("counter"))
        if count is not None:
            self.step_count.copy_(torch.as_tensor(count, dtype=torch.int64))
