"""Plain torch reference of the token bitmask: unpacking it, and applying it to logits in place
(the definition of what ``bitmask_triton`` computes, and its CPU path).

Bit ``i`` of word ``j`` of a row's int32 bitmask allows token ``32*j + i``.
"""

from __future__ import annotations

import torch


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """allowed [B, V] bool from an int32 bitmask [B, ceil(V/32)]: bit i of word j allows token 32*j+i."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1  # [B, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def rows_mask(
    bitmask: torch.Tensor, vocab_size: int, n_rows: int, indices: torch.Tensor | None
) -> torch.Tensor:
    """allowed [B, V]: the unpacked bitmask on the rows in ``indices`` (all rows if None), True elsewhere."""
    allowed = unpack_bitmask(bitmask, vocab_size)
    if indices is None:
        return allowed
    out = torch.ones(n_rows, vocab_size, dtype=torch.bool, device=bitmask.device)
    out[indices] = allowed[indices]
    return out


def apply_bitmask_(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> torch.Tensor:
    """Set disallowed logits to -inf, in place; returns ``logits``.

    ``for b in (indices if indices is not None else range(B)): for i in range(V):
    if not (bitmask[b, i // 32] >> (i % 32)) & 1: logits[b, i] = -inf``
    """
    allowed = rows_mask(bitmask, logits.shape[1], logits.shape[0], indices)
    logits.masked_fill_(~allowed, float("-inf"))
    return logits
