"""Shared fixtures: the devices every contract test runs on, and the `gpu` marker's skip rule."""

import os

import pytest
import torch
from hypothesis import settings

# Property tests draw their examples from a fixed seed (derandomize) and keep no example database, so a
# run is reproducible and a checkout's history cannot change what CI tests; HYPOTHESIS_PROFILE=explore
# draws fresh examples when hunting for bugs.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

if not torch.cuda.is_available():
    # No GPU: the compiled ext/ kernels are tested on CPU through Triton's interpreter
    # (tests/kernels/test_ext_kernels.py). It must be chosen before triton is first imported, and
    # `import lightning_per` imports triton (through torchrl), so it is chosen here.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# `lightning_per.ext` is the top-level ext/ folder, mapped by the install (pyproject's package-dir; `make test`
# installs the checkout in editable mode): the tests need the package installed, and the kernel tests import it
# by that name.

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _torchrl_tree_loads() -> bool:
    """Whether TorchRL's C++ sum tree (its PrioritizedSampler's storage) loads: a TorchRL wheel built against
    another torch installs, but its extension does not load, and its PrioritizedSampler then raises."""
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    try:
        PrioritizedSampler(2, alpha=0.5, beta=0.5)
    except RuntimeError:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    if not _torchrl_tree_loads():
        no_tree = pytest.mark.skip(reason="TorchRL's C++ sum tree (the oracle) does not load against this torch")
        for item in items:
            if "torchrl_tree" in item.keywords:
                item.add_marker(no_tree)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)
