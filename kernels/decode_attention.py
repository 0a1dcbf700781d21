"""Batch-invariant decode attention over keys already gathered: a row's result depends on
that row's keys alone.

`decode_attention_torch` (any device): one query token per row, its keys [B, nkv, L, hd] (L a
multiple of ATTN_CHUNK, the keys past the row's length masked by `visible`) in fixed
ATTN_CHUNK-key blocks merged in order (online softmax); every op has one shape whatever L and
the other rows are, and a block past a row's length is an exact no-op. The deterministic
decode with torch kernels gathers each row's keys through its block table and runs this. The
paged kernels (Triton, and the torch path of the CPU) are in paged_attention.py.
"""

from __future__ import annotations

import math

import torch

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
