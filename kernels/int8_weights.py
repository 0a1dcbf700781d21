"""Weight-only int8 matmuls for the CPU: a linear layer's matrix kept as int8 with one scale per
output column, multiplied by bfloat16 activations in torch's packed int8 CPU kernel
(``torch._weight_int8pack_mm``). A decode step on the CPU is bound by the bytes of weights it
reads, and this reads a quarter of float32's and half of bfloat16's.

    w [K, N] (for ``x @ w``)  ->  Int8Weight(q [N, K] int8, scale [N]):  w ≈ (q * scale[:, None]).T

Symmetric, per output column: ``scale = max |w[:, n]| / 127``, ``q = round(w / scale)``, so an
entry is off by at most half a step, ``scale / 2``. ``int8_matmul_reference`` is the float32
oracle of the packed kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Int8Weight(NamedTuple):
    """A [K, N] matrix (``x @ w``) as int8 rows of its transpose and their scales."""

    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N], the activations' dtype

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.q.shape[1], self.q.shape[0]))


def quantize_int8(w: torch.Tensor) -> Int8Weight:
    """w [K, N] -> Int8Weight, per output column, symmetric; the scale in w's dtype."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"quantize_int8 takes a 2-d float matrix, got {tuple(w.shape)} {w.dtype}")
    if w.shape[0] % 16:  # torch's packed kernel reads K in steps of 16 (it crashes on others)
        raise ValueError(f"the packed int8 matmul takes K rows, a multiple of 16; got K={w.shape[0]}")
    t = w.t().float()
    scale = t.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    q = torch.round(t / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
    return Int8Weight(q, scale.to(w.dtype))


def dequantize_int8(w: Int8Weight) -> torch.Tensor:
    """The [K, N] float32 matrix ``w`` stands for."""
    return (w.q.float() * w.scale.float()[:, None]).t()


def int8_matmul(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """x [..., K] (bfloat16 or float32, w.scale's dtype) @ w -> [..., N] in x's dtype."""
    K = x.shape[-1]
    if K != w.q.shape[1]:
        raise ValueError(f"x has {K} features, the int8 matrix takes {w.q.shape[1]}")
    y = torch._weight_int8pack_mm(x.reshape(-1, K).contiguous(), w.q, w.scale)
    return y.view(*x.shape[:-1], w.q.shape[0])


def int8_matmul_reference(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """The oracle: x @ dequantize(w) in float32, rounded to x's dtype."""
    return (x.float() @ dequantize_int8(w)).to(x.dtype)


def matmul(x: torch.Tensor, w) -> torch.Tensor:
    """x @ w for a tensor or an Int8Weight (the mm of a model with int8 weights)."""
    return int8_matmul(x, w) if isinstance(w, Int8Weight) else torch.matmul(x, w)
