"""The shared bitmask format: int32 ``[batch, ceil(vocab/32)]``; bit ``i`` of word ``j``
allows token ``32*j + i`` (the layout XGrammar and llguidance use)."""

from __future__ import annotations

import numpy as np


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(batch: int, vocab_size: int) -> np.ndarray:
    """An int32 ``[batch, ceil(vocab_size/32)]`` mask with every token allowed."""
    return np.full((batch, bitmask_width(vocab_size)), -1, dtype=np.int32)


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """bool ``[batch, vocab_size]``: True where the token is allowed (``bitmask``: int32
    ``[batch, width]``; at most ``32 * width`` columns). One pass of ``np.unpackbits`` over
    the words' bytes, which on a little-endian host hold bits 0..31 in that order."""
    b = np.ascontiguousarray(bitmask, dtype=np.int32)
    count = min(vocab_size, 32 * b.shape[1])
    return np.unpackbits(b.view(np.uint8), axis=1, count=count, bitorder="little").view(np.bool_)


def apply_bitmask_(logits, bitmask, indices=None):
    """Set disallowed logits to ``-inf`` in place (torch tensors; torch imported lazily).

    ``logits``: float ``[B, V]``; ``bitmask``: int32 ``[B or len(indices), ceil(V/32)]``
    (numpy or torch); ``indices``: rows of ``logits`` the mask rows apply to.
    """
    import torch

    if isinstance(bitmask, np.ndarray):
        bitmask = torch.from_numpy(bitmask)
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    bitmask = bitmask.to(logits.device)
    V = logits.shape[-1]
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().reshape(bitmask.shape[0], -1)
    if allowed.shape[1] < V:
        pad = torch.zeros(allowed.shape[0], V - allowed.shape[1], dtype=torch.bool, device=logits.device)
        allowed = torch.cat([allowed, pad], dim=1)
    allowed = allowed[:, :V]
    if indices is None:
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        idx = torch.as_tensor(indices, device=logits.device, dtype=torch.long)
        logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
    return logits
