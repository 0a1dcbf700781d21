"""Verification leaves the sampling distribution unchanged (chi-square over many seeds, fixed so
the outcome is deterministic): the first emitted token (the accepted draft or the bonus) follows
the masked, filtered target distribution p; a draft d is accepted with probability p(d); after a
rejection the bonus follows the residual p(. | . != d); two positions compose."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import binomtest, chisquare

from deepinfer import kernels

from ._util import pack_bitmask
from .test_sample_distribution import expected_probs

V = 45
N = 20000


def _chi2(counts: torch.Tensor, q: torch.Tensor) -> float:
    """p-value of counts against probabilities q (bins with expected < 5 pooled)."""
    n = counts.sum()
    assert counts[q == 0].sum() == 0, (
        f"sampled impossible tokens {torch.nonzero(counts * (q == 0)).flatten()}"
    )
    exp = q * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big & (q > 0)].sum().reshape(1)])
    ex = torch.cat([exp[big], exp[~big & (q > 0)].sum().reshape(1)])
    if ex[-1] < 5:
        obs, ex = obs[:-1], ex[:-1]
        ex *= obs.sum() / ex.sum()
    return chisquare(obs.numpy(), ex.numpy()).pvalue


CASES = [  # (id, temperature, top_k, top_p, min_p, which draft: "likely" | "unlikely" | "masked")
    ("plain-likely", 1.0, 0, 1.0, 0.0, "likely"),
    ("plain-unlikely", 1.0, 0, 1.0, 0.0, "unlikely"),
    ("joint-likely", 0.7, 8, 0.9, 0.02, "likely"),
    ("draft-masked-out", 1.2, 0, 1.0, 0.0, "masked"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_first_token_follows_target(case):
    _, temperature, top_k, top_p, min_p, which = case
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, V, generator=gen) * 1.5  # positions 0 and 1
    allowed = torch.zeros(2, V, dtype=torch.bool)
    allowed[0, [0, 3, 4, 9, 13, 20, 21, 22, 31, 32, 33, 40, 44]] = True
    allowed[1] = True
    p = expected_probs(logits[0], allowed[0], temperature, top_k, top_p, min_p)
    order = torch.argsort(p, descending=True)
    d = {"likely": order[0], "unlikely": order[int((p > 0).sum()) - 1], "masked": torch.tensor(1)}[
        which
    ].item()
    out = kernels.verify(
        logits[None].expand(N, 2, V), torch.full((N, 1), d),
        bitmask=pack_bitmask(allowed)[None].expand(N, 2, -1).contiguous(),
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        seed=torch.arange(N) * 7919 + 5, step=torch.arange(N) % 13, backend="torch",
    )  # fmt: skip
    first = out.tokens[:, 0]
    accepted = out.accepted == 1
    assert torch.equal(first[accepted], torch.full((int(accepted.sum()),), d))
    assert torch.equal(first[~accepted], out.bonus[~accepted])
    # emitted first token ~ p
    assert _chi2(torch.bincount(first, minlength=V).double(), p) > 1e-3
    # acceptance rate = p(d)
    assert binomtest(int(accepted.sum()), N, float(p[d])).pvalue > 1e-3
    # after a rejection the bonus ~ residual: p without d, renormalised
    resid = p.clone()
    resid[d] = 0
    if resid.sum() > 0 and (~accepted).sum() > 100:
        counts = torch.bincount(out.bonus[~accepted], minlength=V).double()
        assert _chi2(counts, resid / resid.sum()) > 1e-3


def test_two_positions_compose():
    """Drafts (d0, d1): the emitted pair (first two tokens when d0 is accepted, bonus otherwise)
    has the target's joint law p0(x) * p1(y | x == d0)."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, V, generator=gen) * 2.0
    p0 = torch.softmax(logits[0].double(), 0)
    p1 = torch.softmax(logits[1].double(), 0)
    d0 = int(p0.argmax())
    d1 = int(torch.argsort(p1, descending=True)[1])  # the second most likely token
    out = kernels.verify(
        logits[None].expand(N, 3, V),
        torch.tensor([[d0, d1]]).expand(N, 2),
        temperature=1.0,
        seed=torch.arange(N) + 99,
        step=torch.arange(N) % 7,
        backend="torch",
    )
    assert binomtest(int((out.accepted >= 1).sum()), N, float(p0[d0])).pvalue > 1e-3
    both = out.accepted >= 1
    second = out.tokens[both, 1]  # the token after an accepted d0 (accepted d1 or the bonus)
    assert _chi2(torch.bincount(second, minlength=V).double(), p1) > 1e-3
    assert binomtest(int((out.accepted == 2).sum()), int(both.sum()), float(p1[d1])).pvalue > 1e-3
