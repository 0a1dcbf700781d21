"""A CPU decode step's attention in one C call (``decode_attention.c``, built into the library of
kernels/int4_gemv.py), one row or several: `paged_attention._attend_float32`'s eight torch ops
cost ~80 us a layer at SmolLM2's shapes for one row, mostly dispatch and the float32 copies of
the keys and values (for several rows, a gather of every row's keys padded to the longest, and
their copies), where the C loop reads each key and value once. The arithmetic is the
reference's (scores and softmax in float32, the output rounded once to bfloat16), its sums in
another order: an output may differ from the reference's by a bfloat16 step."""

from __future__ import annotations

import torch

from .int4_gemv import STATE


def usable(q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, softcap: float) -> bool:
    """Whether the C calls take these: the library loaded (with its call of several rows where q
    has more than one), no soft-cap, bfloat16 query and contiguous caches, head_dim a multiple of
    16 up to 256, at most 16 query heads a KV head (a query that is a view is copied first)."""
    R, nkv, g, hd = q.shape
    return (
        STATE.attention is not None
        and (R == 1 or STATE.attention_rows is not None)
        and not softcap
        and q.dtype == k_flat.dtype == v_flat.dtype == torch.bfloat16
        and q.device.type == "cpu"
        and hd % 16 == 0
        and hd <= 256
        and g <= 16
        and k_flat.is_contiguous()
        and v_flat.is_contiguous()
    )


def decode_attention(q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, slots: torch.Tensor | None,
                     start: int, L: int) -> torch.Tensor:  # fmt: skip
    """q [1, nkv, g, hd] against the L keys at cache slots ``start`` .. ``start + L - 1`` (``slots``
    None) or at ``slots`` (int64 [L]) of the flat caches [slots, nkv, hd] -> [1, nkv, g, hd]
    bfloat16 (`usable` must hold)."""
    _, nkv, g, hd = q.shape
    q = q.contiguous()
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


def decode_attention_rows(q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, slots: torch.Tensor,
                          lens: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """R rows in one call: q [R, nkv, g, hd], row r against its ``lens[r]`` keys at
    ``slots[r, :lens[r]]`` (int64 [R, L]) of the flat caches -> [R, nkv, g, hd] bfloat16, each
    row the bits :func:`decode_attention` gives it alone (`usable` must hold). No padded key is
    read, so no mask is applied; the rows are split over torch's threads."""
    R, nkv, g, hd = q.shape
    q, slots, lens = q.contiguous(), slots.to(torch.int64).contiguous(), lens.to(torch.int64).contiguous()
    threads = max(1, min(torch.get_num_threads(), R))
    out = torch.empty_like(q)
    scratch = torch.empty(threads * g * slots.shape[1], dtype=torch.float32)
    rc = STATE.attention_rows(q.data_ptr(), k_flat.data_ptr(), v_flat.data_ptr(), slots.data_ptr(),
                              slots.shape[1], lens.data_ptr(), R, nkv, g, hd, scratch.data_ptr(),
                              out.data_ptr(), threads)  # fmt: skip
    if rc:
        raise ValueError(f"decode_attention_rows: shapes outside the C kernel's (g {g}, hd {hd})")
    return out
