"""What the paged attention kernels (``paged_attention_triton``, ``paged_prefill_triton``,
``paged_invariant_triton``) share: the soft-capped score in log2 units, and the host side of
their launches, which pass the caches' strides, the scores' scalars and the shape constants
in the same order."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import INTERPRET

LOG2E = 1.4426950408889634


@triton.jit
def scaled(s, qk_scale, cap_in, cap_out, SOFTCAP: tl.constexpr):
    """Scores q k in log2 units: s * qk_scale (scale * log2(e)), or soft-capped, softcap *
    tanh(s * scale / softcap) * log2(e) = (2 sigmoid(s * cap_in) - 1) * cap_out."""
    if SOFTCAP:
        return (2.0 * tl.sigmoid(s * cap_in) - 1.0) * cap_out
    return s * qk_scale


def score_scalars(scale: float, window: int, softcap: float) -> tuple[float, int, float, float]:
    """(qk_scale, window, cap_in, cap_out) of ``scaled``: the tile kernels' score arguments."""
    return scale * LOG2E, window, 2.0 * scale / softcap if softcap else 1.0, softcap * LOG2E


def cache_strides(
    block_tables: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> tuple[int, ...]:
    """The block table's two strides, then the K and the V cache's first three (block, slot,
    KV head; the head dimension is contiguous)."""
    return (*block_tables.stride(), *k_cache.stride()[:3], *v_cache.stride()[:3])


def shape_constants(q: torch.Tensor, k_cache: torch.Tensor) -> dict[str, object]:
    """The constexprs of a launch for q [N, nkv, g, hd] over ``k_cache``'s blocks: NKV, G, HD,
    HD_PAD, BLOCK_SIZE and IEEE: float32 dots, for float32 inputs and under the interpreter, whose
    tl.dot of bfloat16 operands gives garbage (triton 3.9); on the GPU 16-bit operands stay 16-bit
    (tensor cores)."""
    _, nkv, g, hd = q.shape
    return {
        "NKV": nkv,
        "G": g,
        "HD": hd,
        "HD_PAD": max(16, triton.next_power_of_2(hd)),
        "BLOCK_SIZE": k_cache.shape[1],
        "IEEE": q.dtype == torch.float32 or INTERPRET,
    }
