"""The third-party private attributes that lightning_per.replay.compat relies on still exist (one test each)."""

import importlib.metadata

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter

from lightning_per.replay import compat


def test_tensordict_new_unsafe_exists():
    assert callable(getattr(TensorDict, "_new_unsafe", None))
    td = compat.unsafe_tensordict({"a": torch.zeros(3, 2)}, torch.Size([3]), None)
    assert td.batch_size == torch.Size([3]) and td["a"].shape == (3, 2)


def test_storage_len_value_and_compilable_exist():
    storage = LazyTensorStorage(4)
    assert "_len_value" in storage.__dict__ and hasattr(storage, "_compilable")
    storage.set(torch.arange(2), TensorDict({"a": torch.zeros(2)}, [2]))
    assert compat.unlocked_len(storage) == len(storage) == 2


def test_storage_bump_mutation_revision():
    storage = LazyTensorStorage(4)
    compat.bump_mutation_revision(storage)  # absent on older torchrl: a no-op, never an error
    major, minor = (int(x) for x in __import__("torchrl").__version__.split(".")[:2])
    if (major, minor) >= (0, 12):
        assert callable(getattr(storage, "_bump_mutation_revision", None))


def test_pytree_tree_leaves_exists():
    assert compat.tree_leaves({"a": torch.zeros(1), "b": [torch.ones(2)]})[1].shape == (2,)


def test_round_robin_writer_private_attributes_exist():
    writer = TensorDictRoundRobinWriter()
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), writer=writer)
    for name in ("_cursor", "_write_count", "_mark_update_entities"):
        assert hasattr(type(writer), name), name
    assert compat.direct_writer(writer)
    assert compat.writer_cursor(writer) == 0
    assert compat.advance_writer(writer, 6, 4) == 0
    assert writer._cursor == 2 and writer._write_count == 6 and compat.writer_cursor(writer) == 2
    compat.mark_update_entities(writer, torch.arange(2))
    assert len(rb) == 0


def test_storage_attached_entities_compilable_and_stored_data_exist():
    storage = LazyTensorStorage(4)
    rb = TensorDictReplayBuffer(storage=storage)
    assert callable(getattr(storage, "_attached_entities_iter", None))
    assert rb in list(compat.attached_entities(storage))
    assert hasattr(storage, "_compilable") and compat.is_compilable(storage) is False
    assert compat.stored_data(storage) is None or hasattr(compat.stored_data(storage), "keys")
    rb.extend(TensorDict({"a": torch.zeros(2)}, [2]))
    assert "a" in compat.stored_data(storage).keys()



def test_layout_options_read_the_lazy_storage_keywords():
    assert compat.layout_options(LazyTensorStorage(4)) == {"consolidated": False, "shared_init": False}
    assert compat.layout_options(LazyTensorStorage(4, consolidated=True)) == {"consolidated": True,
                                                                             "shared_init": False}

@pytest.mark.torchrl_tree
def test_inherited_torchrl_state_the_adapters_use_exists():
    """The TorchRL state our subclasses read or override as their own (not behind compat: it is theirs by
    inheritance) is still where they look for it."""
    from torchrl.data import TensorDictPrioritizedReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler, SamplerWithoutReplacement

    storage = LazyTensorStorage(4)
    for name in ("_init_standard", "_len", "_storage"):
        assert hasattr(storage, name), name
    storage.set(torch.arange(2), TensorDict({"a": torch.zeros(2)}, [2]))
    assert hasattr(storage, "_last_cursor")
    assert callable(getattr(PrioritizedSampler, "_empty", None))
    assert callable(getattr(SamplerWithoutReplacement, "_get_sample_list", None))
    assert hasattr(SamplerWithoutReplacement(), "_sample_list")
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(4))
    for name in ("_storage", "_sampler", "_writer", "_transform", "_replay_lock", "_write_lock", "_dim_extend",
                 "_delayed_init", "_batch_size"):
        assert hasattr(rb, name), name
    for name in ("_dump_prefetch_state", "_load_prefetch_state"):
        assert callable(getattr(type(rb), name, None)), name


def test_torchrl_buffers_hand_their_generator_to_the_sampler_as_rng():
    """TorchRL's samplers declare ``_rng`` and its buffers assign their generator to it (what the device samplers'
    ``_rng`` setter follows)."""
    from torchrl.data.replay_buffers.samplers import RandomSampler, Sampler

    assert "_rng" in vars(Sampler)
    sampler = RandomSampler()
    gen = torch.Generator().manual_seed(0)
    TensorDictReplayBuffer(storage=LazyTensorStorage(4), sampler=sampler, generator=gen)
    assert sampler._rng is gen


def test_register_without_replacement_uses_torchrls_dispatch_table_where_it_exists():
    """torchrl >= 0.12 dispatches ``replacement=False`` through ``samplers.base._REPLACEMENT_DISPATCH``; older
    versions have neither the table nor the keyword, and GPURandomSampler applies the rule itself."""
    from lightning_per import GPURandomSampler
    from lightning_per.replay.random import GPUSamplerWithoutReplacement

    try:
        from torchrl.data.replay_buffers.samplers.base import _REPLACEMENT_DISPATCH
    except ImportError:
        assert compat.register_without_replacement(GPURandomSampler, GPUSamplerWithoutReplacement) is False
    else:
        assert _REPLACEMENT_DISPATCH[GPURandomSampler] is GPUSamplerWithoutReplacement
    assert type(GPURandomSampler(replacement=False, device="cpu")) is GPUSamplerWithoutReplacement
    assert type(GPURandomSampler(replacement=True, device="cpu")) is GPURandomSampler


def test_buffer_parts_locks_plain_extend_and_generator_read_torchrls_private_state():
    """compat.buffer_parts / buffer_locks / plain_extend / buffer_generator: the buffer's parts (the constructor
    arguments before a delayed init), its two locks, what makes its extend more than a write, its generator."""
    import threading

    from torchrl.data import RandomSampler
    from torchrl.envs.transforms import Compose, RenameTransform

    storage, sampler, writer = LazyTensorStorage(4), RandomSampler(), TensorDictRoundRobinWriter()
    gen = torch.Generator().manual_seed(0)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, writer=writer, generator=gen)
    assert compat.buffer_parts(rb) == (storage, sampler, writer)
    assert compat.buffer_parts(rb) == (rb.storage, rb.sampler, rb.writer)  # the public reads, once initialised
    replay_lock, write_lock = compat.buffer_locks(rb)
    assert type(replay_lock) is type(threading.RLock())
    with replay_lock, write_lock:
        pass
    assert compat.plain_extend(rb)
    assert compat.buffer_generator(rb) is gen
    assert compat.buffer_generator(TensorDictReplayBuffer(storage=LazyTensorStorage(4))) is None

    delayed = TensorDictReplayBuffer(storage=LazyTensorStorage(4), sampler=RandomSampler(), delayed_init=True)
    assert not delayed.initialized and not compat.plain_extend(delayed)
    parts = compat.buffer_parts(delayed)
    assert isinstance(parts.storage, LazyTensorStorage) and isinstance(parts.sampler, RandomSampler)
    assert not delayed.initialized  # reading the parts does not initialise the buffer

    transformed = TensorDictReplayBuffer(storage=LazyTensorStorage(4),
                                         transform=Compose(RenameTransform(["a"], ["b"])))
    assert not compat.plain_extend(transformed)
    assert not compat.plain_extend(TensorDictReplayBuffer(storage=LazyTensorStorage(4, ndim=2), dim_extend=1))


@pytest.mark.skipif(tuple(int(p) for p in importlib.metadata.version("torchrl").split(".")[:2]) < (0, 14),
                    reason="TorchRL < 0.14's writers keep no generations")
def test_round_robin_writer_bump_generation_exists():
    writer = TensorDictRoundRobinWriter(track_generations=True)
    TensorDictReplayBuffer(storage=LazyTensorStorage(4), writer=writer)
    assert callable(getattr(writer, "_bump_generation", None))
    compat.bump_generation(writer, torch.tensor([1, 2]), TensorDict({"a": torch.zeros(2)}, [2]))
    assert writer.generations_of(torch.arange(4)).tolist() == [-1, 0, 0, -1]
