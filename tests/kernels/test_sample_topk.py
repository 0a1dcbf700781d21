"""Top-k by the exact k-th largest score (``sample_topk``): the Triton paths against the torch
reference on random rows (the row's top groups by pass 1's group maxima, the per-row search,
flat, peaked and tied rows, overflowing ties, rows with fewer allowed tokens than k, mixed
batches, real vocabularies on a GPU), a constructed row whose k-th score is alone in its group,
the select's helpers against torch, the reference's top-k set against its definition, and the
sampled frequencies on flat and peaked rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from scipy.stats import chisquare

from deepinfer import kernels
from deepinfer.kernels import SampleTuning, sample_reference, sample_topk

from ._util import TRITON_DEVICES, random_bitmask
from .conftest import INTERPRET

# small layouts so the CPU interpreter sees several chunks and both top-k ways: chunks of 64
# tokens, 16 groups gathered a row (top_k > 16, or ties past 16 groups at the threshold: per row)
SMALL = SampleTuning(chunk_max=64, topk_max=16)


def _run(impl, logits, tuning=SMALL, **kw):
    backend, device = impl
    B = logits.shape[0]
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    kw.setdefault("seed", torch.arange(B, device=device) * 31 + 7)
    kw.setdefault("step", 4)
    return kernels.sample(logits.to(device), backend=backend, tuning=tuning, **kw).tokens.cpu()


def _both(impl, logits, tuning=SMALL, **kw):
    got = _run(impl, logits, tuning, **kw)
    want = _run(("torch", impl[1]), logits, tuning, **kw)
    assert got.tolist() == want.tolist()
    return got


def _top_k_set(s: torch.Tensor, k: int) -> set[int]:
    """The tokens top-k keeps, by its definition: fewer than k scores strictly above."""
    return {i for i in range(len(s)) if s[i] > float("-inf") and int((s > s[i]).sum()) < k}


def test_random_rows_match_reference(impl):
    """Random rows, masks, temperatures and filters: top groups (k <= 16) and the per-row
    search (k > 16) over chunks of 64, the one-program row (split "never", the search over
    several blocks) and one chunk (the search in registers)."""
    gen = torch.Generator().manual_seed(3)
    B, V = 6, 300
    # (split "never" with 128-token blocks: the per-row search passes over three blocks)
    layouts = (SMALL, SampleTuning(chunk_max=64, topk_max=16, split="never", block_max=128), SampleTuning())
    for it, tuning in enumerate(layouts):
        logits = torch.randn(B, V, generator=gen) * (0.5 + 3 * float(torch.rand(1, generator=gen)))
        if it == 1:
            logits = logits.to(torch.bfloat16)
        temp = [1.0, 0.7, 0.0, 1.3, 1.0, 2.0]
        top_k = [5, 16, 3, 40, 1, 9]
        top_p = [1.0, 0.8, 1.0, 0.9, 1.0, 0.5]
        min_p = [0.0, 0.0, 0.0, 0.05, 0.0, 0.0]
        bitmask = random_bitmask(B, V, 0.6, gen)
        _both(impl, logits, tuning, bitmask=bitmask, temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p)


def test_mixed_batch_and_kinds(impl):
    """Top-k rows beside top-p-only, plain and greedy rows (kinds "filter"), and a batch of
    top-k rows only (kinds "top_k": pass 1 and the per-row kernel alone): the reference's tokens."""
    gen = torch.Generator().manual_seed(5)
    B, V = 6, 500
    logits = torch.randn(B, V, generator=gen) * 3
    args = dict(temperature=[0.0, 1.0, 1.0, 0.5, 1.0, 2.0], top_k=[3, 0, 12, 50, 500, 4],
                top_p=[1.0, 0.9, 0.5, 1.0, 1.0, 0.3], min_p=[0.0, 0.0, 0.05, 0.0, 0.0, 0.0])  # fmt: skip
    assert kernels.sample_kinds(*(args[k] for k in ("temperature", "top_k", "top_p")), V) == "filter"
    _both(impl, logits, **args)
    assert kernels.sample_kinds(1.0, [7, 30], 0.9, V) == "top_k"
    _both(impl, logits[:2], temperature=1.0, top_k=[7, 30], top_p=0.9)


def test_ties_and_short_rows(impl):
    """Ties at the k-th score are all kept: integer logits (ties at every chunk's threshold,
    past 16 of them: the per-row way); rows with fewer allowed tokens than k keep them all."""
    gen = torch.Generator().manual_seed(7)
    B, V = 4, 200
    ties = torch.randint(0, 4, (B, V), generator=gen).float()
    got = _both(impl, ties, temperature=1.0, top_k=[1, 5, 16, 3], top_p=[1.0, 0.9, 1.0, 0.5])
    for b in range(B):
        assert ties[b, got[b]] == ties[b].max()  # the top score's ties outnumber every k here
    short = torch.randn(B, V, generator=gen)
    short[:, 6:] = float("-inf")
    got = _both(impl, short, temperature=1.0, top_k=[3, 10, 50, 6])
    assert bool((got < 6).all())


@triton.jit
def _helpers_kernel(v_ptr, key_ptr, below_ptr, kth_ptr, N, BLOCK: tl.constexpr):
    # order_key and float_below of each value; kth_key's k-th largest for k = 1..N
    offs = tl.arange(0, BLOCK)
    ok = offs < N
    v = tl.load(v_ptr + offs, mask=ok, other=0.0)
    key = sample_topk.order_key(v)
    tl.store(key_ptr + offs, key, mask=ok)
    for i in range(N):
        vi = tl.sum(tl.where(offs == i, v, 0.0))
        tl.store(below_ptr + i, sample_topk.float_below(vi))
    keys = tl.where(ok & (v > float("-inf")), key, -2147483648)  # (sample_topk.NO_KEY: no entry)
    lo = tl.full((), -2147483647, tl.int32)
    hi = tl.full((), 2147483647, tl.int32)
    for k in range(1, N + 1):
        t, _n = sample_topk.kth_key(keys, k, k, lo, hi)
        tl.store(kth_ptr + k - 1, tl.min(tl.where(keys >= t, v, float("inf"))))


def test_select_helpers_match_torch():
    """order_key orders as the floats, float_below is torch.nextafter(v, -inf), kth_key finds
    the k-th largest (with multiplicity), on edge values: +-0, denormals, +-inf, ties."""
    device = "cpu" if INTERPRET else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    vals = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1.0, -1.0, 3.4e38, -3.4e38, float("inf"), 2.5, 2.5, -7.0,
                         1.5e-39, -1.5e-39])  # fmt: skip
    N = len(vals)
    key = torch.empty(N, dtype=torch.int32, device=device)
    below = torch.empty(N, device=device)
    kth = torch.empty(N, device=device)
    _helpers_kernel[(1,)](vals.to(device), key, below, kth, N, BLOCK=16)
    key, below, kth = key.cpu(), below.cpu(), kth.cpu()
    for i in range(N):
        for j in range(N):
            assert bool(key[i] < key[j]) == bool(vals[i] < vals[j]), (vals[i], vals[j])
    want = torch.nextafter(vals, torch.full_like(vals, float("-inf")))
    assert below.view(torch.int32).tolist() == want.view(torch.int32).tolist()
    assert kth.tolist() == sorted(vals.tolist(), reverse=True)


@triton.jit
def _group_kth_kernel(v_ptr, out_ptr, N, BLOCK: tl.constexpr):
    # group_kth of the values' order keys (-inf: no entry) for k = 1..N + 1
    offs = tl.arange(0, BLOCK)
    v = tl.load(v_ptr + offs, mask=offs < N, other=float("-inf"))
    keys = tl.where(v > float("-inf"), sample_topk.order_key(v), -2147483648)
    for k in range(1, N + 2):
        tl.store(out_ptr + k - 1, sample_topk.group_kth(keys, k))


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_group_kth_matches_torch(device):
    """group_kth is the k-th largest entry (with multiplicity), and NO_KEY + 1 past the entries."""
    vals = torch.tensor([2.5, -1.0, 2.5, float("-inf"), 0.0, -0.0, 7.0, 1e-45, 2.5, -3.0, float("-inf"), 1.0])
    N = len(vals)
    out = torch.empty(N + 1, dtype=torch.int32, device=device)
    _group_kth_kernel[(1,)](vals.to(device), out, N, BLOCK=16)
    entries = sorted((v for v in vals.tolist() if v > float("-inf")), reverse=True)
    for k in range(1, N + 2):
        want = _key(torch.tensor(entries[k - 1])) if k <= len(entries) else -(2**31) + 1
        assert int(out[k - 1]) == want, k


def _key(v: torch.Tensor) -> int:
    """sample_topk.order_key of a float32: its bits, the negative ones' flipped, +-0 as 0."""
    bits = int(v.to(torch.float32).view(torch.int32))
    return 0 if float(v) == 0.0 else (bits if bits >= 0 else bits ^ 0x7FFFFFFF)


def test_reference_top_k_set_is_the_definition():
    """sample_reference.topk_low: {s > low} is exactly the set top-k keeps (ties kept), -inf
    where top-k is off or fewer than k tokens are allowed."""
    gen = torch.Generator().manual_seed(9)
    R, V = 8, 60
    s = torch.randint(-5, 5, (R, V), generator=gen).float() * 0.5
    s[0, 10:] = float("-inf")
    k = torch.tensor([12, 1, 3, 7, 0, 60, 59, 20])
    low = sample_reference.topk_low(s, k)
    for r in range(R):
        kr = int(k[r])
        if not 0 < kr < V or int((s[r] > float("-inf")).sum()) < kr:
            assert low[r] == float("-inf")
            continue
        assert {int(i) for i in torch.nonzero(s[r] > low[r])} == _top_k_set(s[r], kr)


PEAKED = torch.tensor([6.0, 5.5, 5.0, 2.0] + [0.0] * 36)
FLAT = torch.linspace(0.0, 0.5, 40)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(("row", "top_k", "top_p"), [("flat", 5, 1.0), ("flat", 8, 0.9), ("peaked", 3, 1.0),
                                                     ("peaked", 6, 0.95)])  # fmt: skip
def test_top_k_frequencies(impl, row, top_k, top_p, split):
    """Chi-square: top-k on flat rows (the top 5 of 40 hold ~14% of the mass: without drawing
    above the k-th score, four first draws would rarely be kept) and on peaked rows; the row as
    one chunk (the per-row search), or split into chunks of 16 (the top groups of 16 tokens)."""
    backend, device = impl
    if (backend, device) == ("triton", "cpu"):
        pytest.skip("interpreter: its tokens equal the reference's (the tests above)")
    n = 6000
    logits = (FLAT if row == "flat" else PEAKED).clone()
    V = len(logits)
    p = torch.softmax(logits.double(), 0)
    order = torch.argsort(p, descending=True, stable=True)
    keep = torch.zeros(V, dtype=torch.bool)
    mass = 0.0
    for rank, i in enumerate(order.tolist()):
        if rank >= top_k or (top_p < 1 and mass >= top_p):
            break
        keep[i] = True
        mass += float(p[i])
    q = torch.where(keep, p, 0.0)
    q = q / q.sum()
    tuning = SampleTuning(chunk_max=16, topk_max=8) if split else SampleTuning()
    tokens = _run(impl, logits.expand(n, V).contiguous(), tuning, temperature=1.0, top_k=top_k,
                  top_p=top_p, seed=torch.arange(n) * 7919 + 5, step=torch.arange(n) % 13)  # fmt: skip
    counts = torch.bincount(tokens, minlength=V).double()
    assert counts[~keep].sum() == 0
    exp = q[keep] * n
    assert chisquare(counts[keep].numpy(), exp.numpy()).pvalue > 1e-3


# chunks of 1024 tokens (32 groups of 32), 64 groups gathered a row (top_k <= 64; ties past 64
# groups at the threshold: the per-row way); and 8 groups for top_k <= 8 (top_k = 8: the groups'
# search must stop at exactly the 8th largest group max)
GROUPS = SampleTuning(chunk_max=1024, topk_max=64)
TIGHT = SampleTuning(chunk_max=256, topk_max=8)


def _rows(kind: str, B: int, V: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "flat":
        return torch.randn(B, V, generator=gen) * 0.3
    if kind == "peaked":  # a few tokens far above the rest
        x = torch.randn(B, V, generator=gen)
        x[:, torch.randperm(V, generator=gen)[:8]] += 12.0
        return x
    return torch.randint(0, 6, (B, V), generator=gen).float()  # "ties"


@pytest.mark.parametrize("kind", ["flat", "peaked", "ties"])
def test_top_groups_match_reference(impl, kind):
    """Rows over three chunks of 1024 (the last one short) or ten of 256, flat, peaked and tied,
    half masked or nearly all masked (fewer groups with a token than k): k = 1, up to the groups
    gathered, past them (the per-row way), k >= V (off); with and without top-p. The
    reference's tokens."""
    gen = torch.Generator().manual_seed(11 + len(kind))
    B, V = 8, 2500
    logits = _rows(kind, B, V, gen)
    bitmask = random_bitmask(B, V, 0.5, gen)
    bitmask[5:7] = random_bitmask(2, V, 0.02, gen)  # ~50 tokens a row, in fewer than 64 groups
    top_p = [0.9, 0.5, 0.95, 0.7, 0.9, 0.9, 0.9, 0.3]
    for tuning, top_k in ((GROUPS, [1, 7, 32, 33, 64, 100, V, 5]), (TIGHT, [8, 8, 1, 7, 8, 3, 8, 9])):
        _both(impl, logits, tuning, bitmask=bitmask, temperature=1.0, top_k=top_k)
        _both(impl, logits, tuning, bitmask=bitmask, temperature=0.8, top_k=top_k, top_p=top_p)


def test_top_groups_hold_the_kth(impl):
    """The groups gathered hold the k-th largest score when it is the only high one in its group:
    seven groups top out near 1.0, an eighth at 0.9, every other token is 0 (top_k = 8 of 8
    groups gathered: the 0.9 group must be among them, else the draws would reach the zeros)."""
    B, V = 16, 2500
    row = torch.zeros(V)
    for i, g in enumerate((3, 11, 20, 29, 40, 52, 61)):
        row[g * 32 + 5] = 1.0 + 0.01 * i
    row[70 * 32 + 9] = 0.9
    got = _both(impl, row.expand(B, V).contiguous(), TIGHT, temperature=0.5, top_k=8)
    assert bool((row[got] >= 0.9).all())


def test_top_groups_many_high_tokens(impl):
    """Eight whole groups of high scores (in one of the 8 sets whose maxima start the groups'
    search) over a low row: the 8 groups gathered hold 256 tokens at or above their threshold,
    more than fit the rank of group_kth, so kth_key finds v_k among them."""
    B, V = 16, 2500
    row = torch.rand(V, generator=torch.Generator().manual_seed(2))
    for i, g in enumerate(range(2, 66, 8)):
        row[g * 32 : g * 32 + 32] = 5.0 + 0.001 * torch.arange(32) + 0.00003 * i
    got = _both(impl, row.expand(B, V).contiguous(), TIGHT, temperature=0.01, top_k=8)
    assert bool((row[got] >= row.topk(8).values[-1]).all())


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="needs CUDA, TRITON_INTERPRET=0")
@pytest.mark.parametrize("V", [49152, 128256, 262144])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_real_shapes_match_reference(V, dtype):
    """The default layout at real vocabularies (chunks of 4096, 128 groups gathered): N(0, 4)
    rows half masked, peaked rows and bfloat16's ties; k = 1 up to past the groups gathered and
    k >= V, with and without top-p, mixed with greedy and top-p rows. Same tokens as the torch
    reference on the device."""
    gen = torch.Generator(device="cuda").manual_seed(V)
    B = 48
    logits = torch.randn(B, V, device="cuda", generator=gen) * 2
    logits[16:32] = logits[16:32] * 0.5
    logits[16:32, torch.randint(0, V, (16, 40), device="cuda", generator=gen)] += 10.0  # peaked
    logits = logits.to(dtype)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (B, (V + 31) // 32), device="cuda", dtype=torch.int32,
                            generator=gen)  # fmt: skip
    ks = [1, 5, 50, 50, 100, 128, 129, 1000, V, 0, 50, 2]
    top_k = torch.tensor([ks[i % len(ks)] for i in range(B)], device="cuda")
    for top_p, temperature in ((1.0, 1.0), (0.9, 0.7)):
        temp = torch.full((B,), temperature, device="cuda")
        temp[::13] = 0.0
        seed = torch.arange(B, device="cuda")
        args = dict(bitmask=bitmask, temperature=temp, top_k=top_k, top_p=top_p, seed=seed, step=7)
        got = kernels.sample(logits, backend="triton", **args).tokens
        want = kernels.sample(logits, backend="torch", **args).tokens
        assert got.tolist() == want.tolist()


def test_top_p_around_the_top_k_sets_mass(impl):
    """Top-k + top-p where top-p's threshold sits near the top-k set's mass r (of Z): below r
    minus the set's lowest token (top-p cuts inside the set: the rounds), just below and just
    above r (it keeps every draw, measured), and past r by more than the verdicts' slack (the
    set's mass alone settles it: draw 0 without the rounds). The reference's tokens in each."""
    gen = torch.Generator().manual_seed(5)
    B, V, k = 16, 2500, 6
    row = torch.randn(V, generator=gen) * 0.5
    row[torch.randperm(V, generator=gen)[:k]] = torch.tensor([4.0, 3.8, 3.5, 3.3, 3.2, 3.0])
    p = torch.softmax(row.double(), 0)
    top = p.topk(k).values
    r, lowest = float(top.sum()), float(top[-1])
    logits = row.expand(B, V).contiguous()
    for top_p in (r - lowest - 0.02, r - lowest / 2, r - 1e-4, r + 1e-4, r + 0.01, min(r + 0.1, 0.999)):
        for tuning in (GROUPS, TIGHT):
            got = _both(impl, logits, tuning, temperature=1.0, top_k=k, top_p=top_p)
            assert bool((row[got] >= 3.0).all())


def test_top_k_bound_gathers_fewer_groups_same_tokens(impl, monkeypatch):
    """A call told its rows' largest top_k (``top_k_bound``, read from host values when not
    given) gathers ``topk_small_max`` groups where that is enough, else ``topk_max``; rows over
    the bound it was told search the row itself. The tokens are the reference's in every case."""
    from deepinfer.kernels import sample_split
    from deepinfer.kernels.tuning import topk_groups

    tuning = SampleTuning(chunk_max=64, topk_max=16, topk_small_max=8)
    assert topk_groups(tuning, 8) == 8 and topk_groups(tuning, 9) == 16
    assert topk_groups(tuning, None) == 16 and topk_groups(tuning, 0) == 16
    assert topk_groups(SampleTuning(), 50) == 64 and topk_groups(SampleTuning(), 100) == 128
    assert kernels.top_k_max([0, 7, 3]) == 7 and kernels.top_k_max(5) == 5
    assert kernels.top_k_max(torch.tensor([4, 9])) == 9 and kernels.top_k_max(np.array([3, 9])) == 9
    assert kernels.top_k_max(np.int64(6)) == 6 and kernels.top_k_max(["x"]) is None
    gathered = []
    pass1 = sample_split.pass1

    def spy(call, temperature, return_logprobs, warps, top_k=None, kc=1):
        gathered.append(kc)
        return pass1(call, temperature, return_logprobs, warps, top_k, kc)

    monkeypatch.setattr(sample_split, "pass1", spy)
    gen = torch.Generator().manual_seed(11)
    B, V = 5, 400
    logits = torch.randn(B, V, generator=gen) * 2
    bitmask = random_bitmask(B, V, 0.7, gen)
    small = dict(temperature=[1.0, 0.8, 1.0, 1.5, 1.0], top_k=[3, 8, 5, 1, 6],
                 top_p=[1.0, 0.9, 1.0, 1.0, 0.7])  # fmt: skip
    mixed = dict(small, top_k=[3, 8, 12, 1, 16])
    for args, bound, want_kc in ((small, None, 8), (mixed, None, 16), (mixed, 8, 8), (small, 16, 16)):
        gathered.clear()
        _both(impl, logits, tuning, bitmask=bitmask, **args, top_k_bound=bound)  # (rows over 8: per row)
        if impl[0] == "triton":
            assert gathered and set(gathered) == {want_kc}, (args["top_k"], bound)
