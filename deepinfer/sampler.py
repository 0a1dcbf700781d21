"""Plain-torch sampler: bitmask, temperature, top-k / top-p / min-p, seeded per row.

`sample` has the keyword signature of `deepinfer.kernels.sample` (the fused Triton kernel),
so the step loop can swap one for the other. Randomness is a pure function of (seed, step):
row b draws its Gumbel noise from a torch.Generator seeded with mix(seed[b], step[b]), so a
request's tokens do not depend on its batch neighbours, and re-running a step (rollback)
draws the same numbers.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _mix(seed: int, step: int) -> int:
    """splitmix64 of (seed, step) -> a 63-bit generator seed."""
    z = (seed * 0x9E3779B97F4A7C15 + step + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set disallowed tokens to -inf in place. bitmask: [B, ceil(V/32)] int32; bit i of word j
    allows token 32*j + i."""
    B, V = logits.shape
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().view(B, -1)[:, :V]  # [B, V]
    return logits.masked_fill_(~allowed.to(logits.device), float("-inf"))


def sample(
    logits: torch.Tensor,
    *,
    bitmask: torch.Tensor | None = None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seed: torch.Tensor,
    step: torch.Tensor,
) -> torch.Tensor:
    """One token per row. logits [B, V]; the rest [B] (temperature 0 = greedy, lowest id on
    ties; top_k 0, top_p 1, min_p 0 disable their filter). Returns int64 [B]."""
    logits = logits.float().clone() if bitmask is not None else logits.float()
    if bitmask is not None:
        apply_bitmask(logits, bitmask)
    greedy = temperature <= 0
    if bool(greedy.all()):
        return logits.argmax(dim=-1)
    B, V = logits.shape
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits)
    s = logits / temp.unsqueeze(1)  # [B, V]
    keep = torch.isfinite(s)
    if bool((min_p > 0).any()):
        p_rel = torch.exp(s - s.max(dim=-1, keepdim=True).values)  # p_i / p_max
        keep &= p_rel >= min_p.to(s).unsqueeze(1)
    need_sort = (top_k > 0) | (top_p < 1)
    if bool(need_sort.any()):
        sorted_s, order = s.sort(dim=-1, descending=True)
        rank_keep = torch.ones_like(keep)
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V)).to(s.device).clamp(max=V)
        kth = sorted_s.gather(1, (k - 1).long().unsqueeze(1))  # [B, 1]: the k-th largest value
        rank_keep &= s >= kth  # ties at the threshold are kept
        probs = torch.softmax(sorted_s, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass strictly above each sorted entry
        keep_sorted = mass_before < top_p.to(s).unsqueeze(1)
        # the smallest kept value in sorted order; everything >= it is kept (ties kept)
        last = keep_sorted.sum(dim=-1, keepdim=True).clamp(min=1) - 1
        rank_keep &= s >= sorted_s.gather(1, last)
        keep &= rank_keep | ~need_sort.to(s.device).unsqueeze(1)
    noise = torch.empty(B, V, dtype=torch.float32)
    seeds, steps = seed.tolist(), step.tolist()
    for b in range(B):
        g = torch.Generator().manual_seed(_mix(seeds[b], steps[b]))
        noise[b].exponential_(generator=g)  # Exp(1): argmax(p / E) samples from p
    gumbel = -torch.log(noise.to(s.device))
    scores = torch.where(keep, s + gumbel, float("-inf"))
    sampled = scores.argmax(dim=-1)
    return torch.where(greedy.to(s.device), logits.argmax(dim=-1), sampled)
