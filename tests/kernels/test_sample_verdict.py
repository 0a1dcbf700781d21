"""Verdicts: a draw decided from pass 1's chunk results alone (kept or cut for sure), so the
test pass reads only the chunks that can still change a decision.

A verdict must never contradict the exact filters (reference ``_Kept``) on any token of flat,
peaked, tied or masked rows; on a real model's kind of row (the mass in a few tokens) it decides
nearly every draw, and then the test pass reads (almost) nothing, with the reference's tokens."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from deepinfer.kernels import SampleTuning, sample_reference
from deepinfer.kernels.sample_filters import filter_on, verdict
from deepinfer.kernels.triton_common import chunk_mass

from ._util import count_calls, random_bitmask
from .conftest import INTERPRET
from .test_sample_exact import _run


@triton.jit
def _verdict_kernel(q_ptr, ct_ptr, ms_ptr, zs_ptr, k_ptr, p_ptr, mp_ptr, out_ptr, V, S, SP: tl.constexpr):
    # program i: the verdict of a token of score q[i] in chunk ct[i] of a row whose chunks' max
    # and quanta sums are ms[i], zs[i], under filters k[i], p[i], mp[i]
    i = tl.program_id(0)
    cs = tl.arange(0, SP)
    ms = tl.load(ms_ptr + i * S + cs, mask=cs < S, other=float("-inf"))
    zs = tl.load(zs_ptr + i * S + cs, mask=cs < S, other=0)
    top_k = tl.load(k_ptr + i)
    top_p = tl.load(p_ptr + i)
    min_p = tl.load(mp_ptr + i)
    k_on, cut_p, _active = filter_on(top_k, top_p, min_p, V)
    kmax = tl.where(top_k > 0, top_k, 2147483647)
    m = tl.max(ms, 0)
    w = chunk_mass(ms, zs, m)
    v = verdict(
        tl.load(q_ptr + i), tl.load(ct_ptr + i), m, ms, w, tl.sum(w, 0), cs, kmax, k_on, cut_p, top_p, min_p
    )
    tl.store(out_ptr + i, v)


def _rows(gen: torch.Generator, V: int) -> torch.Tensor:
    """Flat, wide, peaked (a model's: a few tokens hold the mass, in one chunk or two) and tied
    rows, and one with most tokens masked."""
    flat = torch.randn(V, generator=gen)
    wide = torch.randn(V, generator=gen) * 4
    peaked = torch.randn(V, generator=gen) - 12.0
    peaked[[7, 40, 41, 150]] = torch.tensor([8.0, 7.0, 6.5, 5.0])
    peaked2 = torch.randn(V, generator=gen) * 2 - 8.0
    peaked2[V - 3 :] = torch.tensor([3.0, 2.0, 9.0])
    ties = torch.randint(0, 4, (V,), generator=gen).float()
    masked = torch.randn(V, generator=gen) * 2
    masked[~random_bitmask(1, V, 0.05, gen).bool().repeat_interleave(32)[:V]] = float("-inf")
    return torch.stack([flat, wide, peaked, peaked2, ties, masked])


def _verdicts(impl, s: torch.Tensor, rows, tok, top_k, top_p, min_p, chunk_max: int) -> torch.Tensor:
    """[P] verdicts of tokens tok[i] of rows rows[i] of s (tempered scores, -inf where masked)
    under filters top_k[i], top_p[i], min_p[i]; chunks of chunk_max tokens."""
    R, V = s.shape
    mc, _q, z = sample_reference.chunk_weights(s, torch.full((R,), float("-inf")), chunk_max)
    S = mc.shape[1]
    dev = impl[1]
    out = torch.empty(rows.numel(), dtype=torch.int32, device=dev)
    args = (
        s[rows, tok],
        tok // sample_reference.chunk_size(V, chunk_max),
        mc[rows],
        z[rows],
        top_k,
        top_p,
        min_p,
    )
    _verdict_kernel[(rows.numel(),)](*(a.contiguous().to(dev) for a in args), out, V, S,
                                     SP=triton.next_power_of_2(S))  # fmt: skip
    return out.cpu()


def _kept(s: torch.Tensor, rows, tok, top_k, top_p, min_p) -> torch.Tensor:
    """[P] the exact filters (the reference's kept()) at the same tokens."""
    return sample_reference._Kept(s[rows], top_k, top_p, min_p)(None, tok)


def _check_sound(v: torch.Tensor, kept: torch.Tensor) -> None:
    assert not ((v == 1) & ~kept).any(), "a verdict kept a token the filters cut"
    assert not ((v == -1) & kept).any(), "a verdict cut a token the filters keep"


@pytest.mark.parametrize(
    "top_k, top_p, min_p",
    [
        (0, 0.9, 0.0),
        (0, 0.5, 0.0),
        (0, 0.99, 0.0),
        (2, 1.0, 0.0),
        (50, 1.0, 0.0),
        (50, 0.9, 0.05),
        (0, 1.0, 0.1),
    ],
)
def test_verdicts_never_contradict_the_filters(impl, top_k, top_p, min_p):
    """On every token of every kind of row (chunks of 32: many per row, the last partial), a
    verdict of 1 is a kept token and -1 a cut one; on the peaked rows the verdicts decide
    nearly all the mass (the draws are rarely left to the test pass)."""
    if impl[0] != "triton":
        pytest.skip("Triton helper")
    gen = torch.Generator().manual_seed(5)
    s = _rows(gen, 200) * 1.25  # (a temperature of 0.8)
    R, V = s.shape
    rows = torch.arange(R).repeat_interleave(V)
    tok = torch.arange(V).repeat(R)
    P = rows.numel()
    filters = (torch.full((P,), top_k), torch.full((P,), top_p), torch.full((P,), min_p))
    v = _verdicts(impl, s, rows, tok, *filters, chunk_max=32)
    allowed = s[rows, tok] > float("-inf")
    _check_sound(v[allowed], _kept(s, rows, tok, *filters)[allowed])
    decided = (torch.softmax(s, dim=1).flatten() * (v != 0)).view(R, V).sum(dim=1)  # P(draw needs no test)
    assert decided[2:4].min() > 0.95, decided
    if top_k == 0 and top_p == 1.0:  # min-p alone: always decided
        assert (v[allowed] != 0).all()


def test_verdicts_at_the_thresholds(impl):
    """Rows of a few tokens a chunk (chunks of 32), each token tested with top-p just above and
    just below its mass above (by 2e-4 of Z: inside the verdicts' slack) and with top-k equal to
    its count above and one more: no verdict contradicts the filters there either."""
    if impl[0] != "triton":
        pytest.skip("Triton helper")
    gen = torch.Generator().manual_seed(6)
    R, V = 12, 256
    s = torch.full((R, V), float("-inf"))
    for r in range(R):
        at = torch.randperm(V, generator=gen)[:16]  # 16 tokens in 8 chunks: some chunks hold several
        s[r, at] = torch.randn(16, generator=gen) * (0.5 + r / 4)
    rows, tok = (s > float("-inf")).nonzero(as_tuple=True)
    e = torch.exp(s - s.max(dim=1, keepdim=True).values)
    above = s[rows] > s[rows, tok][:, None]
    mass = torch.where(above, e[rows], 0.0).sum(dim=1) / e[rows].sum(dim=1)  # of Z
    count = above.sum(dim=1)
    n = rows.numel()
    off = torch.zeros(n, dtype=torch.int64)
    ones = torch.ones(n)
    zeros = torch.zeros(n)
    settings = [
        (off, (mass + 2e-4).clamp(max=0.9999), zeros),  # kept, by 2e-4 of Z
        (off, (mass - 2e-4).clamp(min=1e-4), zeros),  # cut, by as little
        (count, ones, zeros),  # cut: count above == k
        (count + 1, ones, zeros),  # kept
        (count + 1, (mass + 2e-4).clamp(max=0.9999), zeros),
    ]
    for top_k, top_p, min_p in settings:
        v = _verdicts(impl, s, rows, tok, top_k, top_p, min_p, chunk_max=32)
        _check_sound(v, _kept(s, rows, tok, top_k, top_p, min_p))


@pytest.mark.skipif(not INTERPRET, reason="counts helper calls under TRITON_INTERPRET=1")
@pytest.mark.parametrize("split, split2", [("always", True), ("always", False), ("never", True)],
                         ids=["split", "rowtest", "row"])  # fmt: skip
def test_test_pass_reads_only_undecided_chunks(monkeypatch, split, split2):
    """Chunks (and test-pass tiles) of 64, 16 a row; the test pass split over (row, chunk)
    programs, or in the per-row kernel after a split pass 1, or all in the per-row kernel (as
    the DSpark verify kernel). On peaked rows the verdicts settle the draws, and the test pass
    reads at most the peak's chunk of a row (not the 16); on flat rows it reads nearly all of
    them in the rows without top-k (rows with top-k draw above the k-th largest score: after
    the split pass 1, from their top groups, without a test pass). The tokens are the
    reference's in both."""
    tuning = SampleTuning(split=split, split2=split2, block_max=64, chunk_max=64)
    tiles = count_calls(monkeypatch, "tile_sums")
    gen = torch.Generator().manual_seed(8)
    B, V = 8, 1000
    peaked = torch.randn(B, V, generator=gen) - 15.0
    for b in range(B):
        at = 100 * b + 30
        peaked[b, at : at + 4] = torch.tensor([7.0, 6.0, 5.0, 4.5])
    args = dict(temperature=1.0, top_p=torch.tensor([0.9, 0.95, 0.5, 0.99] * 2),
                top_k=torch.tensor([0, 0, 0, 0, 50, 2, 1, 40]), seed=torch.arange(B) * 7, step=3,
                tuning=tuning)  # fmt: skip
    want = _run(("torch", "cpu"), peaked, **args)
    got = _run(("triton", "cpu"), peaked, **args)
    assert got.tokens.tolist() == want.tokens.tolist()
    assert len(tiles) <= B, f"{len(tiles)} tiles tested for {B} peaked rows"
    tiles.clear()
    flat = torch.randn(B, V, generator=gen)
    want = _run(("torch", "cpu"), flat, **args)
    got = _run(("triton", "cpu"), flat, **args)
    assert got.tokens.tolist() == want.tokens.tolist()
    assert len(tiles) >= (B // 2) * 16 // 2  # (rows 0-3 have no top-k)


@pytest.mark.skipif(not INTERPRET, reason="counts helper calls under TRITON_INTERPRET=1")
def test_rounds_read_only_chunks_above_the_cut(monkeypatch):
    """Min-p 0.99 on flat rows cuts the first draws; each round draws above the highest cut score,
    and its passes read only the chunks whose max is above it (the weighing pass) or above the
    round's lowest draw (the test pass): fewer tiles than 16 a pass (the test pass: under half).
    Tokens: the reference's."""
    tiles = count_calls(monkeypatch, "tile_sums")
    weighed = count_calls(monkeypatch, "quanta")  # once a chunk weighed, once a draw's tile
    passes = count_calls(monkeypatch, "row_chunks")
    gen = torch.Generator().manual_seed(9)
    B, V = 6, 1000
    logits = torch.randn(B, V, generator=gen)
    args = dict(temperature=1.0, min_p=0.99, seed=torch.arange(B), step=0,
                tuning=SampleTuning(split="never", block_max=64, chunk_max=64))  # fmt: skip
    want = _run(("torch", "cpu"), logits, **args)
    got = _run(("triton", "cpu"), logits, **args)
    assert got.tokens.tolist() == want.tokens.tolist()
    rounds = len(passes) - B
    assert rounds > 0
    draws = 4 * B + 4 * rounds
    assert len(tiles) < (B + rounds) * 16 // 2, (len(tiles), rounds)
    assert len(weighed) - draws < (B + rounds) * 16, (len(weighed) - draws, rounds)  # (231 of 288 here)
