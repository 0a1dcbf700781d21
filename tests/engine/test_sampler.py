"""The plain-torch sampler: greedy, filters, bitmask, and seeds that ignore the batch."""

from __future__ import annotations

import torch

from deepinfer.sampler import apply_bitmask, sample


def _args(B, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, step=0):
    full = lambda v, dt: torch.full((B,), v, dtype=dt)  # noqa: E731
    return dict(temperature=full(temperature, torch.float32), top_k=full(top_k, torch.int64),
                top_p=full(top_p, torch.float32), min_p=full(min_p, torch.float32),
                seed=full(seed, torch.int64), step=full(step, torch.int64))


def test_greedy_is_argmax_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    assert sample(logits, **_args(2, temperature=0)).tolist() == [1, 0]


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0))
    want = logits.argmax(-1)
    assert torch.equal(sample(logits, **_args(4, top_k=1, seed=3)), want)
    assert torch.equal(sample(logits, **_args(4, top_p=1e-6, seed=3)), want)
    assert torch.equal(sample(logits, **_args(4, min_p=1.0, seed=3)), want)


def test_same_seed_same_token_whatever_the_batch():
    g = torch.Generator().manual_seed(1)
    row = torch.randn(1, 500, generator=g)
    others = torch.randn(5, 500, generator=g)
    alone = sample(row, **_args(1, seed=42, step=7))
    batch = torch.cat([others[:2], row, others[2:]])
    args = _args(6, seed=42, step=7)
    args["seed"] = torch.tensor([1, 2, 42, 3, 4, 5])
    assert sample(batch, **args)[2] == alone[0]
    # another step draws other numbers
    draws = {int(sample(row, **_args(1, seed=42, step=s))[0]) for s in range(40)}
    assert len(draws) > 5


def test_bitmask_only_allowed_tokens():
    V = 70
    logits = torch.zeros(2, V)
    logits[:, 0] = 100.0  # the favourite is masked out
    mask = torch.zeros(2, 3, dtype=torch.int32)
    mask[0, 1] = 1 << 3  # token 35
    mask[1, 2] = (1 << 1) | (1 << 5)  # tokens 65, 69
    for s in range(20):
        t = sample(logits, bitmask=mask, **_args(2, seed=s))
        assert t[0] == 35 and int(t[1]) in (65, 69)
    assert sample(logits, bitmask=mask, **_args(2, temperature=0)).tolist() == [35, 65]
    masked = apply_bitmask(torch.zeros(1, V), mask[1:])
    assert torch.isfinite(masked).nonzero()[:, 1].tolist() == [65, 69]


def test_sampling_frequencies_follow_softmax():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(1, 4)
    n = 2000
    counts = torch.zeros(4)
    for s in range(n):
        counts[sample(logits, **_args(1, seed=s, step=0))[0]] += 1
    from scipy.stats import chisquare

    assert chisquare(counts.numpy(), (probs * n).numpy()).pvalue > 1e-3
    # top_k=2 renormalises over the two best
    counts2 = torch.zeros(4)
    for s in range(n):
        counts2[sample(logits, **_args(1, top_k=2, seed=s))[0]] += 1
    assert counts2[2:].sum() == 0 and abs(counts2[0] / n - 0.625) < 0.05
