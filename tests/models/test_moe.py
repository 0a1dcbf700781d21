"""Mixture-of-experts experts (kernels/moe_experts.py): the torch grouping (CPU path) and the
Triton grouped matmul (CUDA; CPU under TRITON_INTERPRET=1) against the float64 loop over experts,
on tiny shapes: experts with no token, every token on one expert, k = 1, both activations."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deepinfer.kernels.moe_experts import (  # noqa: E402
    moe_experts_reference,
    moe_experts_torch,
    moe_experts_triton,
)

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
IMPLS = {"torch": moe_experts_torch, "triton": moe_experts_triton}


def _case(N, E, k, H, I, dtype, device, routing="random", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, generator=g)
    w_gate_up = torch.randn(E, H, 2 * I, generator=g) / H**0.5
    w_down = torch.randn(E, I, H, generator=g) / I**0.5
    probs = torch.softmax(torch.randn(N, E, generator=g), dim=-1)
    if routing == "one":  # every token's first choice is expert E - 1; experts 1 .. E - 2 idle
        probs[:, -1] += 2.0
        probs[:, 1:-1] = -1.0
    weights, ids = probs.topk(k, dim=-1)
    return [
        t.to(device) for t in (x.to(dtype), w_gate_up.to(dtype), w_down.to(dtype), weights.to(dtype), ids)
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize(
    ("N", "E", "k", "H", "I", "routing", "act"),
    [
        (1, 8, 2, 32, 48, "random", "silu"),  # a decode row
        (37, 6, 3, 48, 40, "random", "gelu_tanh"),  # past one 16-row tile, ragged H and I
        (70, 5, 1, 64, 32, "one", "silu"),  # 70 rows on one expert (two 64-row tiles), idle experts
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_experts_match_reference(device, impl, N, E, k, H, I, routing, act, dtype):
    if impl == "triton" and (device == "cpu") != INTERPRET:
        pytest.skip("Triton runs on CPU only under TRITON_INTERPRET=1, on CUDA only without it")
    args = _case(N, E, k, H, I, dtype, device, routing)
    got = IMPLS[impl](*args, act)
    assert got.shape == (N, H) and got.dtype == dtype
    want = moe_experts_reference(*args, act)
    tol = (1e-5, 0) if dtype == torch.float32 else (5e-2, 2e-2)  # (bf16: 8 bits of mantissa)
    torch.testing.assert_close(got.double().cpu(), want, atol=tol[0], rtol=tol[1])


def test_bad_arguments_raise():
    x, wgu, wd, w, ids = _case(4, 4, 2, 16, 8, torch.float32, "cpu")
    with pytest.raises(ValueError, match="w_down of shape"):
        moe_experts_torch(x, wgu, wd[:, :4], w, ids)
    with pytest.raises(ValueError, match="topk_weights of topk_ids' shape"):
        moe_experts_torch(x, wgu, wd, w[:, :1], ids)
    with pytest.raises(ValueError, match="act one of"):
        moe_experts_torch(x, wgu, wd, w, ids, "relu")
