"""A CPU decode step's add + RMSNorm in one C call (``add_rms_norm.c``, built into the library of
kernels/int4_gemv.py): torch's add and ``rms_norm`` of a 576-wide bfloat16 row cost ~15 us,
mostly dispatch, and a decode step runs 61 of them. The arithmetic is the reference's
(`fused.add_rms_norm_reference`: the sum rounded to bfloat16, the norm in float32, one
rounding), its sum of squares in another order: h may differ by a bfloat16 step."""

from __future__ import annotations

import torch

from .int4_gemv import STATE

ROWS = 4  # at most this many rows take the C call (a decode step's)


def usable(x: torch.Tensor, d: torch.Tensor | None, w: torch.Tensor) -> bool:
    """Whether `add_rms_norm` takes these: the library loaded, bfloat16 contiguous rows, few."""
    return (
        STATE.norm is not None
        and x.dtype == torch.bfloat16
        and w.dtype == torch.bfloat16
        and x.numel() <= ROWS * x.shape[-1]
        and x.is_contiguous()
        and w.is_contiguous()
        and w.shape == x.shape[-1:]
        and (d is None or (d.shape == x.shape and d.dtype == torch.bfloat16 and d.is_contiguous()))
    )


def add_rms_norm(x: torch.Tensor, d: torch.Tensor | None, w: torch.Tensor, eps: float):
    """(s = x + d, rms_norm(s) * w), bfloat16, in one C call (`usable` must hold); s is x when d
    is None."""
    H = x.shape[-1]
    h = torch.empty_like(x)
    if d is None:
        STATE.norm(x.data_ptr(), None, w.data_ptr(), eps, x.numel() // H, H, None, h.data_ptr())
        return x, h
    s = torch.empty_like(x)
    STATE.norm(x.data_ptr(), d.data_ptr(), w.data_ptr(), eps, x.numel() // H, H, s.data_ptr(), h.data_ptr())
    return s, h
