"""Helpers shared by the kernel tests."""

from __future__ import annotations

import os

import pytest
import torch

from deepinfer.kernels.bitmask_reference import pack_bitmask  # noqa: F401 (the tests' import)

# a Triton kernel's devices: the CPU under TRITON_INTERPRET=1, CUDA (marked gpu) without it
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
TRITON_DEVICES = [
    pytest.param("cpu", id="cpu", marks=pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")),
    pytest.param(
        "cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(INTERPRET, reason="interpreter")]
    ),
]


def random_bitmask(B: int, V: int, density: float, gen: torch.Generator) -> torch.Tensor:
    """int32 [B, ceil(V/32)] allowing each token with probability `density`."""
    allowed = torch.rand(B, V, generator=gen) < density
    return pack_bitmask(allowed)


def count_calls(monkeypatch, name: str) -> list:
    """Wrap the Triton helper ``name`` of deepinfer.kernels so each call appends to the returned
    list. Under TRITON_INTERPRET=1 the helpers are plain functions, looked up by name at each call
    in the caller's module: the wrapper takes the name's place in every kernels module that has it."""
    from deepinfer.kernels import (
        sample_filters,
        sample_greedy,
        sample_rows,
        sample_split,
        triton_common,
        verify_triton,
    )

    mods = [
        m
        for m in (triton_common, sample_filters, sample_rows, sample_split, sample_greedy, verify_triton)
        if hasattr(m, name)
    ]
    real = getattr(mods[0], name)
    assert all(getattr(m, name) is real for m in mods), name
    calls: list = []

    def counted(*a):
        calls.append(1)
        return real(*a)

    for m in mods:
        monkeypatch.setattr(m, name, counted)
    return calls


def c_library(tmp_path_factory) -> None:
    """The C library of kernels/int4_gemv.py loaded: its build in the cache when there is one,
    else built into a temporary folder (the test skipped without a C compiler)."""
    from deepinfer.kernels import int4_gemv

    if not int4_gemv.available():
        try:
            folder = str(tmp_path_factory.mktemp("clib"))
            int4_gemv.build(folder)
        except RuntimeError as e:
            pytest.skip(f"C kernels not built: {e}")
        assert int4_gemv.load(folder), int4_gemv.STATE.why
