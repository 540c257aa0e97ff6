"""``sampler=`` means what it means in TorchRL, a sampler instance, on GPUPrioritizedReplayBuffer, GPUReplayBuffer
and make_replay_buffer (names still accepted where they were); every buffer make_replay_buffer returns is a public
class. IS weights are checked against the closed form in NumPy. CPU only; about 3 s."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler

import lightning_per
from lightning_per import (
    GPUPrioritizedReplayBuffer,
    GPUPrioritizedSampler,
    GPURandomSampler,
    GPURankBasedSampler,
    GPUReplayBuffer,
    GPUSliceSampler,
    GPUTensorStorage,
    make_replay_buffer,
)

N = 16


def transitions(n: int) -> TensorDict:
    return TensorDict({"observation": torch.arange(n, dtype=torch.float32).unsqueeze(1).expand(n, 3).clone(),
                       "td_error": torch.zeros(n)}, [n])


def test_an_instance_is_the_buffer_sampler_and_its_weights_are_per():
    sampler = GPUPrioritizedSampler(N, alpha=0.7, beta=0.5, eps=1e-8, device="cpu", seed=0)
    rb = GPUPrioritizedReplayBuffer(sampler=sampler, storage=LazyTensorStorage(N), batch_size=64)
    assert rb.sampler is sampler and isinstance(rb.storage, GPUTensorStorage) and rb.storage.max_size == N
    rb.extend(transitions(10))
    raw = np.arange(1, 11, dtype=np.float64)
    rb.update_priority(torch.arange(10), torch.tensor(raw, dtype=torch.float32))
    batch = rb.sample()
    p = (raw + 1e-8) ** 0.7
    prob = p / p.sum()
    w = (10 * prob) ** -0.5
    want = w / w.max()  # TorchRL's normalisation: by the largest weight over the buffer
    got = batch["priority_weight"].double().numpy()
    np.testing.assert_allclose(got, want[batch["index"].numpy()], rtol=1e-5)


def test_named_and_instance_buffers_draw_alike():
    by_name = GPUPrioritizedReplayBuffer(alpha=0.6, beta=0.4, eps=1e-8, storage=GPUTensorStorage(N, device="cpu"),
                                         sampler="rank", sampler_kwargs={"seed": 3}, batch_size=8)
    by_instance = GPUPrioritizedReplayBuffer(
        sampler=GPURankBasedSampler(N, alpha=0.6, beta=0.4, device="cpu", seed=3), alpha=0.6,
        storage=GPUTensorStorage(N, device="cpu"), batch_size=8)
    for rb in (by_name, by_instance):
        rb.extend(transitions(12))
        rb.update_priority(torch.arange(12), torch.arange(12.0) + 1)
    a, b = by_name.sample(), by_instance.sample()
    assert torch.equal(a["index"], b["index"]) and torch.equal(a["priority_weight"], b["priority_weight"])


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(alpha=0.5), ValueError, r"alpha=0.5 differs from the sampler's alpha=0.7"),
    (dict(eps=1e-3), ValueError, r"eps=0.001 differs"),
    (dict(storage=LazyTensorStorage(N + 1)), ValueError, r"priorities of 16 slots, the storage max_size=17"),
    (dict(sampler_kwargs={"stratified": False}), TypeError, r"sampler_kwargs configure a sampler built by name"),
])
def test_an_instance_that_disagrees_is_refused(kwargs, error, match):
    sampler = GPUPrioritizedSampler(N, alpha=0.7, beta=0.5, device="cpu")
    with pytest.raises(error, match=match):
        GPUPrioritizedReplayBuffer(sampler=sampler, **{"storage": LazyTensorStorage(N), **kwargs})


@pytest.mark.parametrize("make, match", [
    (lambda: GPURandomSampler(device="cpu"),
     r"got GPURandomSampler; a sampler without priorities goes in GPUReplayBuffer"),
    pytest.param(lambda: PrioritizedSampler(N, 0.6, 0.4),  # built in the test: TorchRL's C++ tree may not load
                 r"TorchRL's own prioritized samplers go in TorchRL's TensorDictReplayBuffer",
                 marks=pytest.mark.torchrl_tree),
    (lambda: object(), r"or an instance of GPUPrioritizedSampler, GPURankBasedSampler, GPUPrioritizedSliceSampler"),
])
def test_the_prioritized_buffer_says_where_other_samplers_go(make, match):
    sampler = make()
    with pytest.raises(TypeError, match=match):
        GPUPrioritizedReplayBuffer(sampler=sampler, storage=LazyTensorStorage(N))


def test_a_name_still_needs_the_exponents():
    with pytest.raises(TypeError, match=r"needs alpha= and beta="):
        GPUPrioritizedReplayBuffer(beta=0.4, storage=LazyTensorStorage(N))


@pytest.mark.parametrize("make, cls", [
    (lambda: GPUPrioritizedSampler(N, alpha=0.6, beta=0.4, device="cpu"), GPUPrioritizedReplayBuffer),
    (lambda: GPURankBasedSampler(N, alpha=0.6, beta=0.4, device="cpu"), GPUPrioritizedReplayBuffer),
    (lambda: GPURandomSampler(device="cpu"), GPUReplayBuffer),
    (lambda: RandomSampler(), GPUReplayBuffer),
    (lambda: GPUSliceSampler(N, slice_len=4, traj_key="episode", device="cpu"), GPUReplayBuffer),
])
def test_make_replay_buffer_takes_an_instance(make, cls):
    sampler = make()
    rb = make_replay_buffer(N, 8, sampler=sampler, device="cpu")
    assert type(rb) is cls and rb.sampler is sampler
    data = transitions(12)
    data["episode"] = torch.arange(12) // 6
    rb.extend(data)
    batch = rb.sample()
    assert batch.batch_size == (8,) and bool((batch["index"] < 12).all())
    rb.update_priority(batch["index"], torch.ones(8))  # one loop for every buffer


def test_make_replay_buffer_refuses_options_with_an_instance():
    with pytest.raises(TypeError, match=r"sampler options \['stratified'\] with a sampler instance"):
        make_replay_buffer(N, 8, sampler=GPUPrioritizedSampler(N, 0.6, 0.4, device="cpu"), stratified=False)
    with pytest.raises(ValueError, match=r"priorities of 16 slots, the storage max_size=32"):
        make_replay_buffer(32, 8, sampler=GPUPrioritizedSampler(N, 0.6, 0.4, device="cpu"))
    with pytest.raises(ValueError, match=r"GPURandomSampler given has no priorities: leave them unset"):
        make_replay_buffer(N, 8, sampler=GPURandomSampler(device="cpu"), alpha=0.6)
    with pytest.raises(TypeError, match=r"or a TorchRL sampler instance"):
        make_replay_buffer(N, 8, sampler=3)


@pytest.mark.parametrize("name", ["uniform", "slice"])
def test_every_factory_buffer_is_a_public_class(name):
    kwargs = {"slice_len": 4, "traj_key": "episode"} if name == "slice" else {}
    rb = make_replay_buffer(N, 8, sampler=name, device="cpu", **kwargs)
    cls = type(rb)
    assert cls is GPUReplayBuffer and not cls.__name__.startswith("_")
    assert getattr(lightning_per, cls.__name__) is cls and isinstance(rb, TensorDictReplayBuffer)


def test_gpu_replay_buffer_takes_instances_only():
    with pytest.raises(TypeError, match=r"got the name 'uniform' \(make_replay_buffer\(sampler=...\) takes names\)"):
        GPUReplayBuffer(sampler="uniform")
    with pytest.raises(TypeError, match=r"prioritized samplers go in GPUPrioritizedReplayBuffer"):
        GPUReplayBuffer(sampler=GPUPrioritizedSampler(N, 0.6, 0.4, device="cpu"))
    rb = GPUReplayBuffer(storage=LazyTensorStorage(N), device="cpu", batch_size=4)  # TorchRL's defaults, ours
    assert isinstance(rb.sampler, GPURandomSampler) and isinstance(rb.storage, GPUTensorStorage)
    rb.extend(transitions(5))
    assert rb.sample().batch_size == (4,)
