"""Sampled frequencies over many seeds match softmax(masked logits / T) after top-k / top-p /
min-p (chi-square, fixed seeds, so the outcome is deterministic)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from deepinfer import kernels

from ._util import pack_bitmask

V = 45  # not a multiple of 32: the last bitmask word is partial


def _allowed(kind: str) -> torch.Tensor:
    allowed = torch.zeros(V, dtype=torch.bool)
    if kind == "one":
        allowed[37] = True
    elif kind == "all":
        allowed[:] = True
    else:  # scattered, across both words
        allowed[[0, 3, 4, 9, 13, 20, 21, 22, 31, 32, 33, 40, 44]] = True
    return allowed


def expected_probs(logits, allowed, temperature, top_k=0, top_p=1.0, min_p=0.0) -> torch.Tensor:
    """The target distribution, written independently of the kernels (float64, via a sort)."""
    s = torch.where(allowed, logits.double() / temperature, float("-inf"))
    p = torch.softmax(s, 0)
    order = torch.argsort(p, descending=True)
    keep = torch.zeros(V, dtype=torch.bool)
    mass = 0.0
    for rank, i in enumerate(order.tolist()):
        if p[i] == 0 or (top_k and rank >= top_k) or (top_p < 1 and mass >= top_p):
            break
        keep[i] = p[i] >= min_p * p.max()
        mass += p[i].item()
    q = torch.where(keep, p, 0.0)
    return q / q.sum()


CASES = [  # (id, mask kind, temperature, top_k, top_p, min_p)
    ("one-token", "one", 1.0, 0, 1.0, 0.0),
    ("all-plain", "all", 1.0, 0, 1.0, 0.0),
    ("all-top-k", "all", 0.8, 6, 1.0, 0.0),
    ("all-top-p", "all", 1.0, 0, 0.7, 0.0),
    ("all-min-p", "all", 1.2, 0, 1.0, 0.15),
    ("scattered-joint", "scattered", 0.7, 8, 0.9, 0.02),
    # flat (T = 3) with top-k 2: all four first draws are cut in most rows, so the rounds of
    # four draws above the highest cut score pick the token
    ("all-top-k-rounds", "all", 3.0, 2, 1.0, 0.0),
]
ROUNDS_SAMPLES = 4000  # torch on CPU: the rounds run row by row
# the interpreter runs ~30 ms a row: fewer samples there (its tokens equal the reference's anyway)
SAMPLES = {"cpu": {"torch": 20000, "triton": 300}, "cuda": {"torch": 20000, "triton": 20000}}
TRITON_CPU_CASES = {"one-token", "all-top-p", "scattered-joint"}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_frequencies_match_target(impl, case):
    backend, device = impl
    name, kind, temperature, top_k, top_p, min_p = case
    if (backend, device) == ("triton", "cpu") and name not in TRITON_CPU_CASES:
        pytest.skip("interpreter: a subset of the cases")
    n = SAMPLES[device][backend]
    if name == "all-top-k-rounds" and device == "cpu":
        n = ROUNDS_SAMPLES
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(V, generator=gen) * 1.5
    allowed = _allowed(kind)
    q = expected_probs(logits, allowed, temperature, top_k, top_p, min_p)

    out = kernels.sample(
        logits.expand(n, V).to(device),
        bitmask=pack_bitmask(allowed[None]).expand(n, -1).contiguous().to(device),
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        seed=torch.arange(n, device=device) * 7919 + 5, step=torch.arange(n, device=device) % 13,
        backend=backend,
    )  # fmt: skip
    tokens = out.tokens.cpu()
    assert not out.empty.any()
    counts = torch.bincount(tokens, minlength=V).double()
    assert counts[q == 0].sum() == 0, (
        f"sampled filtered-out tokens {torch.nonzero(counts * (q == 0)).flatten()}"
    )
    if (q > 0).sum() == 1:
        return
    # chi-square over bins with expected count >= 5; the rest pooled into one bin
    exp = q * n
    big = exp >= 5
    obs_bins = torch.cat([counts[big], counts[~big & (q > 0)].sum().reshape(1)])
    exp_bins = torch.cat([exp[big], exp[~big & (q > 0)].sum().reshape(1)])
    if exp_bins[-1] < 5:
        obs_bins, exp_bins = obs_bins[:-1], exp_bins[:-1]
        exp_bins *= obs_bins.sum() / exp_bins.sum()
    assert len(exp_bins) >= 2
    p_value = chisquare(obs_bins.numpy(), exp_bins.numpy()).pvalue
    assert p_value > 1e-3, (name, p_value, obs_bins.tolist(), exp_bins.round().tolist())
