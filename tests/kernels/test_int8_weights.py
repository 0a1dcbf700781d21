"""Weight-only int8 matmul (kernels/int8_weights.py): the packed CPU kernel against its float32
reference on random inputs, and the quantisation's error bound."""

from __future__ import annotations

import pytest
import torch

from deepinfer.kernels.int8_weights import (
    Int8Weight,
    dequantize_int8,
    int8_matmul,
    int8_matmul_reference,
    matmul,
    quantize_int8,
)


@pytest.mark.parametrize("K,N", [(64, 96), (576, 192), (48, 7)])
def test_quantisation_is_within_half_a_step_per_column(K, N):
    g = torch.Generator().manual_seed(K * N)
    w = torch.randn(K, N, generator=g) * torch.rand(N, generator=g) * 3  # columns of other ranges
    w[:, 0] = 0  # an all-zero column keeps a positive scale
    qw = quantize_int8(w)
    assert qw.q.dtype == torch.int8 and qw.q.shape == (N, K) and qw.shape == (K, N)
    err = (dequantize_int8(qw) - w).abs()
    assert (err <= qw.scale.float()[None, :] / 2 + 1e-6).all()
    assert torch.equal(dequantize_int8(qw)[:, 0], torch.zeros(K))


@pytest.mark.parametrize("rows", [1, 3, 17])
def test_packed_kernel_equals_reference_on_random_inputs(rows):
    g = torch.Generator().manual_seed(rows)
    for K, N in [(64, 96), (576, 1728), (48, 24)]:
        w = (torch.randn(K, N, generator=g) / K**0.5).bfloat16()
        qw = quantize_int8(w)
        x = torch.randn(2, rows, K, generator=g).bfloat16()
        got, want = int8_matmul(x, qw), int8_matmul_reference(x, qw)
        assert got.shape == (2, rows, N) and got.dtype == torch.bfloat16
        # float32 accumulation in both; they differ by the bfloat16 rounding of the result
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        assert torch.equal(matmul(x, qw), got)
        dense = torch.randn(K, 5, generator=g).bfloat16()
        assert torch.equal(matmul(x, dense), x @ dense)


def test_bad_shapes_are_refused():
    qw = quantize_int8(torch.randn(16, 4))
    with pytest.raises(ValueError, match="x has 5 features, the int8 matrix takes 16"):
        int8_matmul(torch.randn(1, 5), qw)
    with pytest.raises(ValueError, match="2-d float matrix"):
        quantize_int8(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="a multiple of 16; got K=40"):
        quantize_int8(torch.randn(40, 4))
    assert isinstance(qw, Int8Weight)
