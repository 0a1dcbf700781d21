"""Helpers shared by the kernel tests."""

from __future__ import annotations

import torch


def random_bitmask(B: int, V: int, density: float, gen: torch.Generator) -> torch.Tensor:
    """int32 [B, ceil(V/32)] allowing each token with probability `density`."""
    allowed = torch.rand(B, V, generator=gen) < density
    return pack_bitmask(allowed)


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """bool [B, V] -> int32 [B, ceil(V/32)], bit i of word j allows token 32*j+i."""
    B, V = allowed.shape
    W = (V + 31) // 32
    padded = torch.zeros(B, W * 32, dtype=torch.int64)
    padded[:, :V] = allowed.long()
    words = (padded.view(B, W, 32) << torch.arange(32)).sum(-1)  # < 2**32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def count_calls(monkeypatch, module, name: str) -> list:
    """Wrap ``module.name`` so each call appends to the returned list (Triton helpers are plain
    functions under TRITON_INTERPRET=1, looked up by name at each call)."""
    calls: list = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: calls.append(1) or real(*a))
    return calls
