"""A CPU decode step's RoPE and K/V cache store in one C call (``rope_store.c``, built into the
library of kernels/int4_gemv.py): `fused.rope_store_torch`'s multiply, roll, multiply, add and
two ``index_copy_`` cost tens of µs a layer at SmolLM2's shapes, mostly dispatch. The arithmetic
is the reference's, rounding for rounding (each product and the sum rounded to bfloat16 as torch
rounds them): the same bits as `rope_store_torch`."""

from __future__ import annotations

import torch

from .int4_gemv import STATE

ROWS = 4  # at most this many tokens take the C call (a decode step's)
_BF16 = torch.bfloat16


def usable(qk, v, cos, sin_signed, positions, k_flat, v_flat, slots, nh: int) -> bool:
    """Whether `rope_store` takes these (`rope_store_torch`'s arguments): the library loaded, a
    few tokens, the tokens' own cos and sin rows (``positions`` None), bfloat16 on the CPU, each
    token's heads side by side, contiguous tables, caches and int64 slots. (Checked at every
    layer of a decode step: the cheap tests first, each tensor's strides read once.)"""
    if STATE.rope is None or positions is not None or qk.dim() != 3 or v.dim() != 3:
        return False
    N, nqk, hd = qk.shape
    if not 0 < N <= ROWS or qk.dtype != _BF16 or qk.device.type != "cpu":
        return False
    if not (v.dtype == cos.dtype == sin_signed.dtype == k_flat.dtype == v_flat.dtype == _BF16):
        return False
    kv = k_flat.shape
    if len(kv) != 3 or kv[2] != hd or nqk - nh != kv[1] or kv[1] < 1 or v.shape != (N, kv[1], hd):
        return False
    if qk.stride()[1:] != (hd, 1) or v.stride()[1:] != (hd, 1) or v_flat.shape != kv:
        return False
    return (
        cos.numel() == sin_signed.numel() == N * hd
        and slots.dtype == torch.int64
        and slots.shape == (N,)
        and k_flat.is_contiguous()
        and v_flat.is_contiguous()
        and cos.is_contiguous()
        and sin_signed.is_contiguous()
        and slots.is_contiguous()
    )


def rope_store(qk, v, cos, sin_signed, k_flat, v_flat, slots, nh: int) -> torch.Tensor:
    """`fused.rope_store_torch` (positions None) in one C call (`usable` must hold): the tokens'
    k heads of ``qk`` rotated and their ``v`` written at their ``slots``; returns the rotated q
    [N, nh, hd]."""
    N, nqk, hd = qk.shape
    nkv = nqk - nh
    q = torch.empty(N, nh, hd, dtype=qk.dtype)
    rc = STATE.rope(qk.data_ptr(), qk.stride(0), v.data_ptr(), v.stride(0), cos.data_ptr(),
                    sin_signed.data_ptr(), slots.data_ptr(), N, nh, nkv, hd, k_flat.shape[0],
                    k_flat.data_ptr(), v_flat.data_ptr(), q.data_ptr())  # fmt: skip
    if rc:
        raise IndexError(f"rope_store: slots {slots.tolist()} outside the cache's {k_flat.shape[0]}")
    return q
