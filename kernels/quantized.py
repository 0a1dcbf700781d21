"""The matmul of a model whose matrices may be kept quantized: ``x @ w`` for a dense tensor, an
`Int8Weight` (kernels/int8_weights.py) or an `Int4Weight` (kernels/int4_weights.py)."""

from __future__ import annotations

import torch

from .int4_weights import Int4Weight, int4_matmul
from .int8_weights import Int8Weight, int8_matmul


def matmul(x: torch.Tensor, w) -> torch.Tensor:
    t = type(w)
    if t is Int4Weight:
        return int4_matmul(x, w)
    if t is Int8Weight:
        return int8_matmul(x, w)
    return torch.matmul(x, w)
