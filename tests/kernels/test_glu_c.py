"""The C SwiGLU of a CPU decode step (kernels/glu_c.py, glu.c) against `fused.glu_reference` on
random rows (gates of every bfloat16 magnitude among them), and the layer ops' choice of it: a
decode step's few rows, SiLU, and never in deterministic mode (batch-invariant ops)."""

from __future__ import annotations

import pytest
import torch

from deepinfer.kernels import glu_c as cg
from deepinfer.kernels.fused import glu_reference
from deepinfer.models.layers import ops
from tests.kernels._util import c_library


@pytest.fixture(scope="module", autouse=True)
def kernel(tmp_path_factory):
    c_library(tmp_path_factory)


@pytest.mark.parametrize("rows,width", [(1, 1536), (4, 3072), (2, 7)])
def test_glu_silu_equals_its_reference(rows, width):
    g = torch.Generator().manual_seed(rows * width)
    gu = (torch.randn(rows, 2 * width, generator=g) * 4).bfloat16()
    assert cg.usable(gu, "silu")
    got, want = cg.glu_silu(gu), glu_reference(gu, "silu")
    assert got.dtype == torch.bfloat16 and got.shape == want.shape == (rows, width)
    step = want.float().abs() * 2**-7
    assert bool(((got.float() - want.float()).abs() <= step).all())
    assert float((got != want).float().mean()) < 0.001


def test_every_bfloat16_gate():
    """Every finite bfloat16 value as a gate (up 1): silu within a bfloat16 step of torch's,
    and equal on all but a handful."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    gates = bits[torch.isfinite(bits)]
    gu = torch.cat([gates, torch.ones_like(gates)])[None]
    got, want = cg.glu_silu(gu)[0].float(), glu_reference(gu, "silu")[0].float()
    assert bool(((got - want).abs() <= want.abs() * 2**-7 + 1e-30).all())
    assert int((got != want).sum()) <= 8


def test_layer_ops_take_it_for_a_decode_step_only():
    gu = torch.randn(2, 64).bfloat16()
    assert torch.equal(ops(False, 1e-5, quantized=True).glu(gu, "silu"), cg.glu_silu(gu))
    assert torch.equal(ops(True, 1e-5).glu(gu, "silu"), glu_reference(gu, "silu"))  # deterministic mode
    many = torch.randn(cg.ROWS + 1, 64).bfloat16()
    assert not cg.usable(many, "silu") and not cg.usable(gu, "gelu_tanh")
    assert not cg.usable(gu.float(), "silu")
    assert torch.equal(ops(False, 1e-5).glu(many, "silu"), glu_reference(many, "silu"))
