"""Backends under test. TRITON_INTERPRET=1 must be set before the Triton kernels are imported,
so that the "triton" backend runs on CPU; on a GPU machine run with TRITON_INTERPRET=0."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
HAS_CUDA = torch.cuda.is_available()

# (backend, device); the GPU rows are marked `gpu` (skipped without CUDA by tests/conftest.py)
IMPLS = [
    pytest.param(("torch", "cpu"), id="torch-cpu"),
    pytest.param(
        ("triton", "cpu"),
        id="triton-cpu",
        marks=pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1"),
    ),
    pytest.param(("torch", "cuda"), id="torch-cuda", marks=pytest.mark.gpu),
    pytest.param(
        ("triton", "cuda"),
        id="triton-cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(INTERPRET, reason="needs TRITON_INTERPRET=0")],
    ),
]


@pytest.fixture(params=IMPLS)
def impl(request) -> tuple[str, str]:
    """(backend, device) pairs: torch and triton, CPU and CUDA."""
    return request.param
