"""Every public sampler, storage and buffer is one class of ours on exactly one TorchRL base: no mixins of ours in
its MRO (docs/architecture.md, "Adding a draw rule"; capabilities are values the core and its rule hold; the
buffers' verified dumps are functions they call)."""

import pytest

import lightning_per.replay as replay

SAMPLERS = ["GPUPrioritizedSampler", "GPURandomSampler", "GPUSamplerWithoutReplacement"]
COMPOSED = ["GPURankBasedSampler", "GPUSliceSampler", "GPUPrioritizedSliceSampler"]  # rules and indexes they hold
BUFFERS = ["GPUPrioritizedReplayBuffer", "GPUReplayBuffer", "GPUTensorStorage"]


def _ours(cls) -> list[type]:
    return [c for c in cls.__mro__ if c.__module__.startswith("lightning_per")]


@pytest.mark.parametrize("name", SAMPLERS + COMPOSED + BUFFERS)
def test_a_public_sampler_or_buffer_is_one_class_of_ours_on_one_torchrl_base(name):
    cls = getattr(replay, name)
    assert _ours(cls) == [cls]
    torchrl_bases = [b for b in cls.__bases__ if b.__module__.startswith("torchrl")]
    assert len(cls.__bases__) == 1 and len(torchrl_bases) == 1


@pytest.mark.parametrize("name", COMPOSED)
def test_the_remaining_samplers_are_one_class_of_ours_too(name):
    assert _ours(getattr(replay, name)) == [getattr(replay, name)]
