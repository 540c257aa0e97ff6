"""Where the compiled-kernel tests run: ``KDEVS``, the device parameters of ``test_ext_*.py``.

On CUDA the kernels run there (``gpu`` marker); without CUDA, on CPU tensors through Triton's interpreter,
which must be chosen before ``triton`` is first imported (``conftest.py`` sets ``TRITON_INTERPRET=1`` on
machines without CUDA; importing this module first sets it too when a test file runs alone). If triton was
imported without it, the CPU cases are skipped. Skips the importing module when triton is missing.
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # effective only if triton is not imported yet

triton = pytest.importorskip("triton")
from lightning_per.ext import _common  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

if CUDA:
    KDEVS = [pytest.param("cuda", marks=pytest.mark.gpu)]
elif _common.INTERPRET and isinstance(triton.language.cumsum, InterpretedFunction):
    KDEVS = ["cpu"]
else:  # triton (or the kernels) imported earlier in this process without the interpreter
    KDEVS = [pytest.param("cpu", marks=pytest.mark.skip(
        reason="triton was imported without TRITON_INTERPRET=1 (see conftest.py)"))]
