"""The C add + RMSNorm of a CPU decode step (kernels/add_rms_norm.py, add_rms_norm.c) against its
reference (`fused.add_rms_norm_reference` over torch's rms_norm) on random rows of odd widths,
with a residual stream of SmolLM2's range (to 2e4), and the layer ops' choice of it."""

from __future__ import annotations

import pytest
import torch

from deepinfer.kernels import add_rms_norm as cn
from deepinfer.kernels.fused import add_rms_norm_reference
from deepinfer.models.layers import ops
from tests.kernels._util import c_library


@pytest.fixture(scope="module", autouse=True)
def kernel(tmp_path_factory):
    c_library(tmp_path_factory)


@pytest.mark.parametrize("rows,H", [(1, 576), (3, 96), (4, 1536), (2, 33)])
@pytest.mark.parametrize("residual", [True, False])
def test_add_rms_norm_equals_its_reference(rows, H, residual):
    g = torch.Generator().manual_seed(rows * H + residual)
    x = (torch.randn(rows, H, generator=g) * torch.rand(H, generator=g) * 50).bfloat16()
    x[0, H // 2] = 2e4  # an outlier of the residual stream
    d = torch.randn(rows, H, generator=g).bfloat16() if residual else None
    w = (torch.rand(H, generator=g) + 0.5).bfloat16()
    assert cn.usable(x, d, w)
    s, h = cn.add_rms_norm(x, d, w, 1e-5)
    s_ref, h_ref = add_rms_norm_reference(x, d, w, 1e-5, lambda t, w: torch.rms_norm(t, (H,), w, 1e-5))
    assert torch.equal(s, s_ref) and (s is x) == (d is None)
    assert h.dtype == torch.bfloat16 and h.shape == x.shape
    # float32 sums of squares in another order: at most a bfloat16 step apart, nearly all equal
    step = h_ref.float().abs() * 2**-7
    assert bool(((h.float() - h_ref.float()).abs() <= step).all())
    assert float((h != h_ref).float().mean()) < 0.01


def test_layer_ops_take_it_for_a_few_rows_only():
    op = ops(False, 1e-5, quantized=True)
    w = torch.ones(64).bfloat16()
    x, d = torch.randn(2, 64).bfloat16(), torch.randn(2, 64).bfloat16()
    assert torch.equal(op.add_norm(x, d, w)[1], cn.add_rms_norm(x, d, w, 1e-5)[1])
    many = torch.randn(cn.ROWS + 1, 64).bfloat16()
    assert not cn.usable(many, None, w) and not cn.usable(x.float(), None, w.float())
    assert torch.equal(op.add_norm(many, None, w)[1], torch.rms_norm(many, (64,), w, 1e-5))
