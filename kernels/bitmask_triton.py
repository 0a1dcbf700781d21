"""Triton kernel: set the logits a token bitmask forbids to -inf, in place (``bitmask_reference``
defines it)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import INTERPRET


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,
    stride_lb,
    stride_lv,  # [B, V]
    mask_ptr,
    stride_mb,  # [B, W] int32
    rows_ptr,  # [N] int32 rows to mask (HAS_ROWS), else program id
    V,
    HAS_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if HAS_ROWS:
        row = tl.load(rows_ptr + pid).to(tl.int64)
    else:
        row = pid.to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < V
    words = tl.load(mask_ptr + row * stride_mb + offs // 32, mask=inb, other=-1)
    forbidden = ((words >> (offs % 32)) & 1) == 0
    ptrs = logits_ptr + row * stride_lb + offs.to(tl.int64) * stride_lv
    tl.store(ptrs, tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty), mask=inb & forbidden)


def apply_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor:
    """Triton version of :func:`bitmask_reference.apply_bitmask_` (arguments already validated)."""
    B, V = logits.shape
    block = min(1024, triton.next_power_of_2(V))
    rows = indices.to(device=logits.device, dtype=torch.int32) if indices is not None else None
    n = rows.numel() if rows is not None else B
    if n == 0:
        return logits
    grid = (n, triton.cdiv(V, block))
    _apply_bitmask_kernel[grid](
        logits, logits.stride(0), logits.stride(1),
        bitmask, bitmask.stride(0),
        rows if rows is not None else bitmask,
        V, HAS_ROWS=rows is not None, BLOCK=block,
        **({} if INTERPRET else {"num_warps": 4}),
    )  # fmt: skip
    return logits
