"""Plain torch reference of DSpark verification: the definition of what ``verify_triton`` computes.

Speculative verification of deterministic drafts (grammar-forced tokens, n-gram copies: the
draft distribution q is a point mass on the draft token d). Standard speculative sampling
accepts a draft x ~ q with probability min(1, p(x) / q(x)) and, on rejection, samples from the
residual norm(max(0, p - q)). With q = delta_d this becomes:

    accept d with probability min(1, p(d) / 1) = p(d)
    residual: max(0, p(i) - 0) = p(i) for i != d, max(0, p(d) - 1) = 0 at d
              -> p with d removed, renormalised by 1 - p(d)
    P(out = d) = p(d);  P(out = i != d) = (1 - p(d)) * p(i) / (1 - p(d)) = p(i):  out ~ p.

Both stages are realised with ONE draw: the target sample t (the token :func:`sample_reference.sample`
draws with the counter-based random numbers of this position). t ~ p, so
``t == d`` happens with probability p(d) (accept), and given ``t != d``, t is distributed as p
conditioned on not being d, which is exactly the residual (reject, emit t as the bonus token).
The random numbers of draft position k are the hash of (seed, step + k): the very numbers plain decoding
draws at that step, so a request's tokens are the same with and without speculation (not only
equal in distribution), and greedy rows (temperature 0: p is a point mass on the argmax) accept
exactly when the draft is the masked argmax. p is the full target distribution of
``deepinfer.kernels.sample``: bitmask, temperature, top-k / top-p / min-p.
"""

from __future__ import annotations

import torch

from . import sample_reference
from .bitmask_reference import rows_mask
from .sample_reference import CHUNK_MAX


def verify(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    bitmask: torch.Tensor | None,
    indices: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seed: torch.Tensor,
    step: torch.Tensor,
    chunk_max: int = CHUNK_MAX,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify drafts against the target's logits; returns (accepted [B], bonus [B], tokens [B, K+1]).

    Arguments are validated tensors (see ``deepinfer.kernels.verify``): logits [B, K+1, V],
    drafts [B, K] int64, num_drafts [B] int64 in [0, K], bitmask [B, K+1, W] int32 (rows in
    ``indices`` only, all rows if None), per-row [B] sampling parameters; ``chunk_max`` as in
    :func:`sample_reference.sample`. As a loop::

        for b in range(B):
            n = num_drafts[b]
            for k in range(n + 1):                     # draft positions, then the bonus position
                tokens[b, k] = sample_row(logits[b, k], bitmask[b, k], temperature[b], top_k[b],
                                          top_p[b], min_p[b], seed[b], step[b] + k)  # sample_reference.sample
            tokens[b, n + 1:] = -1
            accepted[b] = min([k for k in range(n) if tokens[b, k] != drafts[b, k]], default=n)
            bonus[b] = tokens[b, accepted[b]]          # -1 when that position's mask is empty

    The emitted tokens of row b are ``tokens[b, :accepted[b] + 1]`` (accepted drafts equal their
    target tokens; the last one is the bonus). A position whose mask allows nothing gives -1,
    which never equals a draft.
    """
    B, T, V = logits.shape
    dev = logits.device
    n = num_drafts.to(torch.int64)
    k = torch.arange(T, device=dev)
    valid = k[None, :] <= n[:, None]  # [B, T]: positions 0..n_b of each row
    rows, pos = valid.nonzero(as_tuple=True)  # only those are sampled (no work on padding)
    mask = flat_idx = None
    if bitmask is not None:
        mask = bitmask[rows, pos]  # [R, W]
        if indices is not None:
            constrained = torch.zeros(B, dtype=torch.bool, device=dev)
            constrained[indices] = True
            flat_idx = constrained[rows].nonzero(as_tuple=True)[0]
    x = logits[rows, pos].float()  # [R, V]: only positions 0..n_b (no work on padding)
    greedy = temperature[rows] == 0
    if mask is not None and bool(greedy.all()):  # rows whose mask allows their argmax: not masked
        picked = sample_reference.greedy_masked(x, mask, flat_idx)[0]
    else:
        if mask is not None:  # rows outside `indices` are unconstrained
            x = x.masked_fill(~rows_mask(mask, V, len(rows), flat_idx), float("-inf"))
        picked = torch.full((len(rows),), -1, dtype=torch.int64, device=dev)
        g = greedy.nonzero(as_tuple=True)[0]
        if len(g):  # the masked argmax, lowest id on ties, as sample() (which needs no noise for it)
            xg = x[g]
            picked[g] = torch.where(xg.amax(dim=1) == float("-inf"), -1, xg.argmax(dim=1))
        r = (~greedy).nonzero(as_tuple=True)[0]
        if len(r):
            rr, pr = rows[r], pos[r]
            picked[r] = sample_reference.sample(
                x[r], None, None, temperature[rr], top_k[rr], top_p[rr], min_p[rr], seed[rr], step[rr] + pr,
                chunk_max=chunk_max,
            )[0]  # fmt: skip
    tokens = torch.full((B, T), -1, dtype=torch.int64, device=dev)
    tokens[rows, pos] = picked
    mismatch = (tokens[:, : T - 1] != drafts) & valid[:, 1:]  # [B, K]: position k < n_b
    # first mismatching position, or n when every draft matched
    first = torch.where(mismatch, k[None, : T - 1], torch.full_like(mismatch, T, dtype=torch.int64))
    accepted = torch.minimum(first.min(dim=1).values if T > 1 else n, n)
    bonus = tokens.gather(1, accepted[:, None])[:, 0]
    return accepted, bonus, tokens
