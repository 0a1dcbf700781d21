"""Batch-invariant decode attention: a row's result depends on that row's keys alone.

One query token per row. Row b attends to keys [0, positions[b]] of cache slot slot_start + b
(slot-major, as `LlamaModel.decode_static` lays rows out); its g query heads of one KV group
come as a [g, hd] block (GQA without repeating K/V). What it computes, as a Python loop:

    for b, h:  keys = k_cache[slot_start + b, h, : positions[b] + 1]     # [n, hd]
               o[b, h] = softmax(q[b, h] @ keys.T / sqrt(hd)) @ v_cache[slot_start + b, h, :n]

Three implementations, none of which lets the rest of the batch change a row's arithmetic:
- `decode_attention_rows` (CPU): one SDPA call per row over exactly its own keys, so nothing
  but the row's own data and length shapes the call; the lengths are read on the host. The
  CPU's deterministic decode uses it: a 1-row request in an 8-row tile then costs one row.
- `decode_attention_torch` (any device): fixed ATTN_CHUNK-key blocks merged in order (online
  softmax); every op has one shape whatever kv_len and the other rows are, and a block past a
  row's length is an exact no-op. ~20 small kernels a layer on CUDA.
- `decode_attention_triton` (CUDA; CPU under TRITON_INTERPRET=1): one program per (row, KV head)
  walks fixed BLOCK_N-key blocks up to the row's own length; one launch a layer, and the length
  is read on the device, so a CUDA graph needs no kv-length bucket for it. Checked against the
  reference on CPU under TRITON_INTERPRET=1; not yet run on a GPU (the deterministic mode uses
  the torch version by default until it has been).
They differ from each other in rounding (block sizes); each is invariant on its own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ATTN_CHUNK = 256  # keys per block of the torch version (a deterministic cache's length is a multiple)
BLOCK_N = 64  # keys per step of the Triton program


def decode_attention_torch(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """q: [B, nkv, g, hd]; keys, values: [B, nkv, L, hd] (L a multiple of ATTN_CHUNK); visible:
    [B, L] bool. -> [B, nkv, g, hd].

    Block 0 always holds the row's key 0, so the running max is finite after it; later blocks
    merge as m' = max(m, max s), acc' = acc * exp(m - m') + exp(s - m') @ v: a block with no
    visible key has s = -inf everywhere, so exp(m - m') = 1 and it adds exact zeros.
    """
    B, nkv, g, hd = q.shape
    scale = 1.0 / math.sqrt(hd)
    m = denom = acc = None
    for c0 in range(0, keys.shape[2], ATTN_CHUNK):
        k, v = keys[:, :, c0 : c0 + ATTN_CHUNK], values[:, :, c0 : c0 + ATTN_CHUNK]
        s = (q @ k.transpose(-1, -2)).float() * scale  # [B, nkv, g, C]
        s = s.masked_fill(~visible[:, None, None, c0 : c0 + ATTN_CHUNK], float("-inf"))
        if m is None:  # block 0: what the merge below gives from m = -inf, acc = denom = 0
            m = s.amax(dim=-1, keepdim=True)
            p = torch.exp(s - m)
            denom = p.sum(dim=-1, keepdim=True)
            acc = (p.to(v.dtype) @ v).float()
            continue
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        alpha = torch.exp(m - m_new)  # 1 where the max did not move
        p = torch.exp(s - m_new)
        denom = denom * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + (p.to(v.dtype) @ v).float()
        m = m_new
    return (acc / denom).to(q.dtype)


def decode_attention_rows(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: list[int | None], slot_start: int
) -> torch.Tensor:
    """q: [B, nkv, g, hd]; k_cache, v_cache: [S, nkv, L, hd] (one layer); lengths: keys of each
    row (its position + 1), None for a padding row (its output is zeros). -> [B, nkv, g, hd].
    Row b: softmax(q[b] k^T / sqrt(hd)) v over keys [0, lengths[b]) of slot slot_start + b, the
    g query heads of a KV head as g queries of one head (no mask: every key is visible)."""
    out = torch.zeros_like(q)
    for b, n in enumerate(lengths):
        if n is not None:
            s = slot_start + b
            out[b] = F.scaled_dot_product_attention(
                q[b : b + 1], k_cache[s : s + 1, :, :n], v_cache[s : s + 1, :, :n]
            )[0]
    return out


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    slot_start: int = 0,
    *,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [B, nkv, g, hd]; k_cache, v_cache: [S, nkv, L, hd] (one layer, last dim contiguous);
    positions: [B] int64. -> [B, nkv, g, hd] in q's dtype. One launch, no host sync.
    Row b reads slot ``slot_start + b``, or ``slots[b]`` when given ([B] int64: a batch-invariant
    prefill passes one row per token, each with its sequence's slot and its own position)."""
    from .decode_attention_triton import launch

    B, nkv, g, hd = q.shape
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("decode_attention_triton needs caches contiguous in head_dim")
    if slots is None and slot_start + B > k_cache.shape[0]:
        raise ValueError(f"slots [{slot_start}, {slot_start + B}) exceed the cache's {k_cache.shape[0]}")
    q = q.contiguous()
    out = torch.empty_like(q)
    positions = positions.contiguous()  # the kernel reads row b at offset b
    slots = None if slots is None else slots.contiguous()
    launch(q, k_cache, v_cache, out, positions, slot_start, 1.0 / math.sqrt(hd), BLOCK_N, slots)
    return out
