"""The kernels' device RNG (``ext.philox.device_uniform``): uniforms drawn inside the sample kernels.

The oracle is an independent NumPy Philox4x32-10 written from the algorithm's definition (Salmon et al.
2011, SC'11, section 4; round constants and key schedule as published with Random123), checked first
against Random123's known-answer vectors (``kat_vectors``: ``philox4x32 10``), then used to predict
the kernel's uniforms bit for bit (a test kernel stores them), and the sample kernels' draws: a draw from
the RNG state must return exactly what the same kernel returns from the oracle's uniforms passed in, and
the counters must count the draws per position.

Runs on CUDA (``gpu``) or, without CUDA, on CPU tensors through Triton's interpreter (see
``test_ext_kernels.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _kernel_devices import CUDA, KDEVS, triton  # noqa: E402  (sets TRITON_INTERPRET on CPU, as conftest.py)
from _philox import expected_shuffled_uniforms, expected_uniforms, philox4x32_10  # noqa: E402
from lightning_per.ext import philox, sample  # noqa: E402
from lightning_per.ext.philox import device_uniform  # noqa: E402
from lightning_per.ext.state import PriorityTree  # noqa: E402

from lightning_per.ops.selfcheck import make_levels  # noqa: E402

tl = triton.language


@pytest.mark.parametrize("ctr,key,out", [  # Random123 kat_vectors, philox4x32 10
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_numpy_philox_matches_known_answers(ctr, key, out):
    got = philox4x32_10(np.array([ctr], dtype=np.uint64), np.array([key], dtype=np.uint64))
    assert got[0].tolist() == list(out)


def _levels(device, capacity=50):
    return make_levels(capacity, torch.device(device), torch.Generator().manual_seed(7), integer=False)


@triton.jit
def _store_uniforms(rng_ptr, out_ptr):
    k = tl.program_id(0)
    tl.store(out_ptr + k, device_uniform(rng_ptr, k))


@pytest.mark.parametrize("device", KDEVS)
@pytest.mark.parametrize("seed", [0x1234_5678_9ABC_DEF, 2**64 - 12345])  # the second: the top bit set
def test_device_uniforms_are_the_documented_stream_bit_for_bit(device, seed):
    """The uniforms themselves (a test kernel stores what ``device_uniform`` returns), equal to the oracle's
    float64 values exactly: all 53 bits, the seed's 64 bits, counters past 2^32, the domain word."""
    B = 300
    rng = philox.new_rng_state(seed, device)
    assert int(rng[0]) == philox.seed_word(seed) and philox.seed_word(seed) % 2**64 == seed % 2**64
    rng[1 + 7] = 2**32 + 5
    for _ in range(2):
        counts = rng[1:1 + B].cpu().numpy().copy()
        out = torch.empty(B, dtype=torch.float64, device=device)
        _store_uniforms[(B,)](rng, out)
        np.testing.assert_array_equal(out.cpu().numpy(), expected_uniforms(seed, counts))
        np.testing.assert_array_equal(rng[1:1 + B].cpu().numpy(), counts + 1)


@pytest.mark.parametrize("device", KDEVS)
@pytest.mark.parametrize("gather", [False, True])
def test_kernel_draws_the_documented_philox_stream(device, gather):
    leaves, bsum, bmin = _levels(device)
    seed = 0x1234_5678_9ABC_DEF % (1 << 63)
    rng = philox.new_rng_state(seed, device)
    rng[1 + 3] = 2**32 + 5  # a counter past 2^32: its high word reaches the Philox counter
    rows = torch.arange(leaves.numel() * 3, dtype=torch.int64, device=device).view(-1, 3)
    B = 9
    for _ in range(3):  # counters advance one per call at positions < B, others stay
        counts = rng[1:1 + B].cpu().numpy().copy()  # (on CPU .numpy() shares rng's memory)
        u = torch.from_numpy(expected_uniforms(seed, counts)).to(device)
        if gather:
            want = sample.sample_proportional_gather(PriorityTree(leaves, bsum, bmin, beta=0.4), u, rows)
            got = sample.sample_proportional_gather(PriorityTree(leaves, bsum, bmin, beta=0.4, rng=rng), B, rows)
        else:
            want = sample.sample_proportional(PriorityTree(leaves, bsum, bmin, beta=0.4), u)
            got = sample.sample_proportional(PriorityTree(leaves, bsum, bmin, beta=0.4, rng=rng), B)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        np.testing.assert_array_equal(rng[1:1 + B].cpu().numpy(), counts + 1)
        assert int(rng[1 + B:].count_nonzero()) == 0 and int(rng[0]) == seed


@pytest.mark.parametrize("device", KDEVS)
@pytest.mark.parametrize("B", [1, 7, 256, 300])  # 300: a partial last chunk of the ranking loop
def test_shuffled_uniforms_are_the_documented_stream_bit_for_bit(device, B):
    """``shuffled_uniforms`` equals the NumPy model exactly (Philox words, 53-bit keys ranked with ties broken by
    position, ``(rank + U) / B``); every stratum holds one draw; the counters advance once per position."""
    seed = 2**64 - 12345
    rng = philox.new_rng_state(seed, device)
    rng[1 + min(3, B - 1)] = 2**32 + 5
    for _ in range(2):
        counts = rng[1:1 + B].cpu().numpy().copy()
        u = philox.shuffled_uniforms(rng, B)
        want = expected_shuffled_uniforms(seed, counts)
        np.testing.assert_array_equal(u.cpu().numpy(), want)
        assert sorted(np.floor(want * B).astype(int).tolist()) == list(range(B))  # a permutation of the strata
        np.testing.assert_array_equal(rng[1:1 + B].cpu().numpy(), counts + 1)
        assert int(rng[1 + B:].count_nonzero()) == 0
    with pytest.raises(ValueError, match="n must be an int"):
        philox.shuffled_uniforms(rng, philox.SHUFFLE_DRAWS + 1)


def test_shuffled_strata_order_is_a_uniform_permutation():
    """The model's strata order over 6 draws is uniform over the 720 permutations: chi-square over 72,000
    batches (100 expected per permutation) at level 0.001. Power: a bias that moves 10 % of the mass from half
    the permutations to the other half (non-centrality 72,000 * 0.01 = 720 on 719 dof) is rejected with
    probability > 0.999."""
    from itertools import permutations

    from scipy import stats

    B, batches = 6, 72_000
    index = {p: i for i, p in enumerate(permutations(range(B)))}
    counts = np.zeros(len(index))
    for c in range(batches):
        counts[index[tuple(np.floor(expected_shuffled_uniforms(3, np.full(B, c)) * B).astype(int))]] += 1
    assert stats.chisquare(counts).pvalue > 1e-3


def test_uniform_stream_is_uniform():
    """The 53-bit construction of the oracle's stream is U[0, 1): Kolmogorov-Smirnov on 200,000 draws
    (200 positions x 1,000 counters) at level 0.001. Power: the critical distance is 1.95 / sqrt(n) = 0.0044;
    a stream squeezed into [0, 0.99) (or any with a 1 % mass shift) sits at distance 0.01, i.e. 4.5 / sqrt(n),
    rejected with probability > 0.999."""
    from scipy import stats

    u = np.concatenate([expected_uniforms(42, np.full(200, c)) for c in range(1000)])
    assert u.min() >= 0 and u.max() < 1
    assert stats.kstest(u, "uniform").pvalue > 1e-3


@pytest.mark.parametrize("device", KDEVS)
def test_rng_argument_errors_name_the_argument(device):
    leaves, bsum, bmin = _levels(device)
    rng = philox.new_rng_state(1, device)
    with pytest.raises(ValueError, match="u must be the batch size"):
        sample.sample_proportional(PriorityTree(leaves, bsum, bmin, beta=0.4, rng=rng), 0)
    with pytest.raises(ValueError, match="u must be the batch size"):
        sample.sample_proportional(PriorityTree(leaves, bsum, bmin, beta=0.4, rng=rng), philox.DEVICE_RNG_DRAWS + 1)
    with pytest.raises(ValueError, match="rng must have"):
        sample.sample_proportional(PriorityTree(leaves, bsum, bmin, beta=0.4, rng=rng[:10]), 4)
    assert int(rng[1:].count_nonzero()) == 0  # nothing drawn by the refused calls


def _sampler(device, seed, **kw):
    from lightning_per import GPUPrioritizedSampler

    kw.setdefault("shuffle_strata", False)  # strata in order: the kernels draw their own uniforms (device RNG)
    s = GPUPrioritizedSampler(45, 0.6, 0.4, device=device, backend="kernels", seed=seed, **kw)
    s.mark_update(torch.arange(40), storage=_Len(40))
    return s


class _Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


@pytest.mark.parametrize("device", KDEVS)
def test_sampler_device_rng_follows_seeding_and_checkpoints(device):
    storage = _Len(40)
    s = _sampler(device, 5)
    assert s.core.state.rng is not None and int(s.core.state.rng[0]) == 5 and int(
        s.core.state.rng[1:].count_nonzero()) == 0
    first = [s.sample(storage, 8)[0] for _ in range(2)]
    assert s.core.state.rng[1:9].tolist() == [2] * 8  # two draws counted at positions 0..7
    ckpt = s.state_dict()
    cont = [s.sample(storage, 8)[0] for _ in range(2)]
    other = _sampler(device, 99)
    other.load_state_dict(ckpt)  # resumes the stream where the checkpoint left it
    for a, b in zip(cont, [other.sample(storage, 8)[0] for _ in range(2)]):
        assert torch.equal(a, b)
    s.manual_seed(5)  # reseeding restarts the stream: the first draws again
    assert s.core.state.rng[1:].count_nonzero() == 0
    for a, b in zip(first, [s.sample(storage, 8)[0] for _ in range(2)]):
        assert torch.equal(a, b)
    s._rng = torch.Generator().manual_seed(1)  # a buffer generator (TorchRL's set_rng): a new derived seed
    assert int(s.core.state.rng[0]) == s.generator.initial_seed() % (1 << 63) != 5


@pytest.mark.parametrize("device", KDEVS)
def test_batches_beyond_the_device_rng_draw_with_the_generator(device, monkeypatch):
    s = _sampler(device, 5)
    monkeypatch.setattr(s.core.ops, "DEVICE_RNG_DRAWS", 4)
    state = s.generator.get_state()
    index, _ = s.sample(_Len(40), 8)
    assert int(s.core.state.rng[1:].count_nonzero()) == 0  # not counted: the generator drew
    assert not torch.equal(s.generator.get_state(), state)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_graph_replays_draw_the_next_numbers_of_the_stream():
    """A CUDA graph of the draw, captured with no generator registered: each replay draws the stream's next
    uniforms (the oracle's, counter 0, 1, 2 at every position), not the captured ones again."""
    leaves, bsum, bmin = make_levels(3000, torch.device("cuda"), torch.Generator().manual_seed(2), integer=False)
    seed, B = 77, 256
    rng = philox.new_rng_state(seed, "cuda")
    sample.sample_proportional(PriorityTree(leaves, bsum, bmin, beta=0.4, rng=rng), B)  # compile + warm up (counts 1)
    rng[1:].zero_()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        index, w = sample.sample_proportional(PriorityTree(leaves, bsum, bmin, beta=0.4, rng=rng), B)
    rng[1:].zero_()  # the capture ran nothing; zeroed again for clarity
    for count in range(3):
        graph.replay()
        u = torch.from_numpy(expected_uniforms(seed, np.full(B, count))).cuda()
        want_index, want_w = sample.sample_proportional(PriorityTree(leaves, bsum, bmin, beta=0.4), u)
        assert torch.equal(index, want_index) and torch.equal(w, want_w)
    assert rng[1:1 + B].eq(3).all() and rng[1 + B:].eq(0).all()


@pytest.mark.parametrize("device", KDEVS)
def test_checkpoint_without_device_rng_warns_and_does_not_restart_the_stream(device):
    storage = _Len(40)
    s = _sampler(device, 5)
    first = s.sample(storage, 8)[0]
    ckpt = s.state_dict()
    del ckpt["device_rng"]  # as written before the device RNG existed
    other = _sampler(device, 5)
    with pytest.warns(RuntimeWarning, match="no 'device_rng'"):
        other.load_state_dict(ckpt)
    assert int(other.core.state.rng[1:].count_nonzero()) == 0 and int(other.core.state.rng[0]) != 5
    assert not torch.equal(other.sample(storage, 8)[0], first)  # not the original run's first draw again


@pytest.mark.parametrize("device", KDEVS)
def test_set_rng_state_without_device_rng_raises_and_changes_nothing(device):
    s = _sampler(device, 5)
    before = s.get_rng_state()
    with pytest.raises(ValueError, match="device_rng"):
        s.set_rng_state({"generator": torch.Generator().manual_seed(9).get_state(), "device_rng": None})
    after = s.get_rng_state()
    assert torch.equal(after["generator"], before["generator"]) and torch.equal(after["device_rng"],
                                                                                  before["device_rng"])
