"""The Triton filter path (four Gumbel candidates, one test pass, pivot rounds only when all
four are cut) against the torch reference on random rows: top-p near 0 and 1, top-k at ties,
bf16, V not a multiple of the tile, masks leaving one to three tokens, many small tiles."""

from __future__ import annotations

import pytest
import torch

from deepinfer import kernels
from deepinfer.kernels import SampleTuning

from ._util import count_calls, pack_bitmask, random_bitmask
from .conftest import INTERPRET


def _run(impl, logits, bitmask=None, **kw):
    backend, device = impl
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    mask = bitmask.to(device) if bitmask is not None else None
    out = kernels.sample(logits.to(device), bitmask=mask, backend=backend, **kw)
    return out.tokens.cpu()


def _want(logits, bitmask=None, **kw):
    return kernels.sample(logits, bitmask=bitmask, backend="torch", **kw).tokens


def _params(B: int, gen: torch.Generator) -> dict:
    """Per-row settings spanning the fast path (top-p near 1), the rounds (top-p near 0, top-k 1)
    and joint filters."""
    top_p = torch.tensor([1e-6, 0.01, 0.3, 0.9, 0.99, 0.9999, 1.0, 0.5])
    top_k = torch.tensor([0, 1, 2, 3, 4, 5, 50, 0])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.3, 0.0, 0.01, 0.0, 0.0])
    i = torch.randperm(B, generator=gen) % 8
    j = torch.randperm(B, generator=gen) % 8
    return dict(
        temperature=torch.rand(B, generator=gen) * 1.5 + 0.3,
        top_p=top_p[i],
        top_k=top_k[j],
        min_p=min_p[(i + j) % 8],
        seed=torch.randint(0, 2**40, (B,), generator=gen),
        step=torch.arange(B),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("V", [300, 9000], ids=["V300", "V9000"])  # 9000: a full tile + a partial one
def test_random_rows_match_reference(impl, dtype, V):
    gen = torch.Generator().manual_seed(V)
    B = 16
    logits = (torch.randn(B, V, generator=gen) * 2).to(dtype)
    bitmask = random_bitmask(B, V, 0.5, gen)
    args = _params(B, gen)
    torch.testing.assert_close(
        _run(impl, logits, bitmask, **args), _want(logits, bitmask, **args), rtol=0, atol=0
    )


def test_only_top_p_near_one_and_near_zero(impl):
    gen = torch.Generator().manual_seed(11)
    B, V = 12, 700
    logits = torch.randn(B, V, generator=gen) * 3
    args = dict(
        temperature=1.0,
        top_p=torch.tensor([1e-7, 1e-3, 0.02, 0.1, 0.95, 0.999, 0.99999, 1 - 2**-24] * 2)[:B],
        seed=torch.arange(B) + 5,
        step=3,
    )
    torch.testing.assert_close(_run(impl, logits, **args), _want(logits, **args), rtol=0, atol=0)


def test_boundary_ties(impl):
    """Scores on a coarse grid: many tokens tie at the top-k / top-p threshold (all kept)."""
    gen = torch.Generator().manual_seed(12)
    B, V = 16, 600
    logits = torch.randint(0, 6, (B, V), generator=gen).float()  # six distinct values per row
    logits[:4, :] = 0.0  # all tied: every filter keeps everything
    logits[4:8, :] = 0.0
    logits[4:8, 10:13] = 2.0  # three tied on top
    args = dict(
        temperature=1.0,
        top_k=torch.tensor([1, 3, 0, 2] * 4),
        top_p=torch.tensor([0.5, 1.0, 0.1, 0.9] * 4),
        min_p=torch.tensor([0.0, 0.0, 0.5, 0.0] * 4),
        seed=torch.arange(B),
        step=1,
    )
    got = _run(impl, logits, **args)
    torch.testing.assert_close(got, _want(logits, **args), rtol=0, atol=0)
    assert set(got[4:8].tolist()) <= {10, 11, 12}  # top-k 1..3 / small top-p keep the tied top three


@pytest.mark.parametrize("n_allowed", [1, 2, 3, 5])
def test_masks_leaving_few_tokens(impl, n_allowed):
    """Fewer than four allowed tokens leave empty candidate slots."""
    gen = torch.Generator().manual_seed(13 + n_allowed)
    B, V = 8, 1000
    logits = torch.randn(B, V, generator=gen) * 2
    allowed = torch.zeros(B, V, dtype=torch.bool)
    for b in range(B):
        allowed[b, torch.randperm(V, generator=gen)[:n_allowed]] = True
    allowed[0, :] = False
    allowed[0, V - 1] = True  # the last token, in a partial word
    bitmask = pack_bitmask(allowed)
    args = dict(
        temperature=torch.tensor([1.0, 0.7, 2.0, 1.0, 0.5, 1.0, 1.3, 1.0]),
        top_k=torch.tensor([0, 1, 2, 3, 0, 4, 0, 1]),
        top_p=torch.tensor([0.9, 1.0, 0.5, 0.1, 1e-6, 0.99, 0.7, 1.0]),
        min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0]),
        seed=torch.arange(B) * 7,
        step=2,
    )
    got = _run(impl, logits, bitmask, **args)
    torch.testing.assert_close(got, _want(logits, bitmask, **args), rtol=0, atol=0)
    assert got[0] == V - 1
    assert allowed[torch.arange(B), got].all()


def test_many_small_tiles(impl):
    """64-token tiles: candidates enter from many tiles, the test pass and rounds cross tiles."""
    backend, _ = impl
    if backend != "triton":
        pytest.skip("Triton tiling")
    gen = torch.Generator().manual_seed(14)
    B, V = 16, 1000
    logits = (torch.randn(B, V, generator=gen) * 2).to(torch.bfloat16)
    bitmask = random_bitmask(B, V, 0.4, gen)
    args = _params(B, gen)
    got = _run(impl, logits, bitmask, tuning=SampleTuning(block_max=64), **args)
    torch.testing.assert_close(got, _want(logits, bitmask, **args), rtol=0, atol=0)


def test_same_row_many_steps(impl):
    """One peaked row, 32 steps: the fast path (top-p 0.95) and the rounds (top-k 2) both agree."""
    gen = torch.Generator().manual_seed(15)
    V = 2000
    row = torch.randn(1, V, generator=gen) * 4
    logits = row.expand(32, V).contiguous()
    for args in (dict(top_p=0.95), dict(top_k=2), dict(top_k=20, top_p=0.8, min_p=0.05)):
        args = dict(args, temperature=0.8, seed=torch.full((32,), 9), step=torch.arange(32))
        got = _run(impl, logits, **args)
        torch.testing.assert_close(got, _want(logits, **args), rtol=0, atol=0)


@pytest.mark.skipif(not INTERPRET, reason="counts helper calls under TRITON_INTERPRET=1")
def test_rounds_only_when_all_draws_are_cut(monkeypatch):
    """Top-p near 1 keeps one of the four draws (no round: four draws a row); top-k 1 draws
    above the k-th largest score (the max: one pass weighs it, no round); min-p 0.99 on a flat
    row cuts all four almost always and needs the rounds, each of four draws tested in one pass;
    all return the reference's token."""
    calls = count_calls(monkeypatch, "row_draw")
    passes = count_calls(monkeypatch, "row_chunks")  # pass 1 of each row, then one a round
    gen = torch.Generator().manual_seed(16)
    B, V = 8, 3000
    logits = torch.randn(B, V, generator=gen)
    args = dict(temperature=1.0, top_p=0.999, seed=torch.arange(B), step=0)
    torch.testing.assert_close(_run(("triton", "cpu"), logits, **args), _want(logits, **args), rtol=0, atol=0)
    assert len(calls) == 4 * B
    calls.clear()
    passes.clear()
    args = dict(temperature=1.0, top_k=1, seed=torch.arange(B), step=0)
    got = _run(("triton", "cpu"), logits, **args)
    torch.testing.assert_close(got, _want(logits, **args), rtol=0, atol=0)
    assert got.tolist() == logits.argmax(1).tolist()
    assert len(passes) == 2 * B and len(calls) == 4 * B  # pass 1, the pass above the max; 4 draws
    calls.clear()
    passes.clear()
    args = dict(temperature=1.0, min_p=0.99, seed=torch.arange(B), step=0)
    got = _run(("triton", "cpu"), logits, **args)
    torch.testing.assert_close(got, _want(logits, **args), rtol=0, atol=0)
    rounds = len(passes) - B  # (pass 1)
    assert rounds > 0
    assert len(calls) == 4 * B + 4 * rounds
