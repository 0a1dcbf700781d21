"""A CPU decode row's attention in one C call (``decode_attention.c``, built into the library of
kernels/int4_gemv.py): `paged_attention._attend_float32`'s eight torch ops cost ~80 us a layer
at SmolLM2's shapes, mostly dispatch and the float32 copies of the keys and values, where the C
loop reads each key and value once. The arithmetic is the reference's (scores and softmax in
float32, the output rounded once to bfloat16), its sums in another order: an output may differ
from the reference's by a bfloat16 step."""

from __future__ import annotations

import torch

from .int4_gemv import STATE


def usable(q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, mask, softcap: float) -> bool:
    """Whether `decode_attention` takes these: the library loaded, one row (no padding mask), no
    soft-cap, bfloat16 contiguous query and caches, head_dim a multiple of 16 up to 256, at most
    16 query heads a KV head."""
    R, nkv, g, hd = q.shape
    return (
        STATE.attention is not None
        and R == 1
        and mask is None
        and not softcap
        and q.dtype == k_flat.dtype == v_flat.dtype == torch.bfloat16
        and q.device.type == "cpu"
        and hd % 16 == 0
        and hd <= 256
        and g <= 16
        and q.is_contiguous()
        and k_flat.is_contiguous()
        and v_flat.is_contiguous()
    )


def decode_attention(q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, slots: torch.Tensor | None,
                     start: int, L: int) -> torch.Tensor:  # fmt: skip
    """q [1, nkv, g, hd] against the L keys at cache slots ``start`` .. ``start + L - 1`` (``slots``
    None) or at ``slots`` (int64 [L]) of the flat caches [slots, nkv, hd] -> [1, nkv, g, hd]
    bfloat16 (`usable` must hold)."""
    _, nkv, g, hd = q.shape
    out = torch.empty_like(q)
    scratch = torch.empty(g * L, dtype=torch.float32)
    ptr = None
    if slots is not None:
        slots = slots.contiguous()
        ptr = slots.data_ptr()
    rc = STATE.attention(q.data_ptr(), k_flat.data_ptr(), v_flat.data_ptr(), ptr, start, L, nkv, g, hd,
                         scratch.data_ptr(), out.data_ptr())  # fmt: skip
    if rc:
        raise ValueError(f"decode_attention: shapes outside the C kernel's (g {g}, hd {hd}, L {L})")
    return out
