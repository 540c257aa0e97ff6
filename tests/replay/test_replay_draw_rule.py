"""A draw rule defined outside the package plugs into the sampler core (docs/architecture.md, "Adding a draw
rule"): a newest-first rule, sampled and checkpointed through the public buffer."""

import torch
from tensordict import TensorDict

from lightning_per import GPUPrioritizedSampler, make_replay_buffer


class NewestFirst:
    """The ``B`` most recently written slots of a ring of ``n`` items, newest first, weight 1."""

    def __init__(self) -> None:
        self.name, self.device_rng, self.fuses_gather, self.reads_filled = "newest", False, False, True
        self.head = torch.zeros((), dtype=torch.int64)  # the next slot the ring writes (a host copy, kept here)

    def plan(self, core, batch_size: int, n: int) -> tuple:
        return (int(self.head),)

    def draw(self, core, batch_size, n, plan, rows):
        index = (plan[0] - 1 - torch.arange(batch_size, device=core.device)) % n  # [B]
        return index, torch.ones(batch_size, dtype=torch.float32, device=core.device)

    def drew(self, core, n: int, plan: tuple) -> None:
        return None

    def tensors(self) -> tuple:
        return ()


def _buffer(rule):
    return make_replay_buffer(8, 3, device="cpu", rule=rule)


def test_a_newest_first_rule_samples_and_checkpoints_through_the_public_buffer(tmp_path):
    rule = NewestFirst()
    rb = _buffer(rule)
    assert isinstance(rb.sampler, GPUPrioritizedSampler) and rb.sampler.core.rule is rule
    rb.extend(TensorDict({"obs": torch.arange(5.0)}, [5]))
    rule.head.fill_(5)
    batch = rb.sample()
    assert batch["index"].tolist() == [4, 3, 2] and batch["obs"].tolist() == [4.0, 3.0, 2.0]
    assert batch["priority_weight"].tolist() == [1.0, 1.0, 1.0]
    rb.update_priority(batch["index"], torch.tensor([2.0, 3.0, 4.0]))  # the core's write, unchanged
    rb.dumps(tmp_path)
    restored = _buffer(NewestFirst())
    restored.loads(tmp_path)
    torch.testing.assert_close(restored.sampler.core.state.raw, rb.sampler.core.state.raw, rtol=0, atol=0)
    restored.sampler.core.rule.head.fill_(5)
    assert restored.sample()["index"].tolist() == [4, 3, 2]
    assert "rule=newest" in repr(rb.sampler.core)
