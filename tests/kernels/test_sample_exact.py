"""The fused kernel against the torch reference: same tokens bit for bit, batch invariance,
strides, dtypes, empty rows, index lists."""

from __future__ import annotations

import os

import pytest
import torch

from deepinfer import kernels
from deepinfer.kernels import SampleTuning
from deepinfer.kernels.bitmask_reference import unpack_bitmask

from ._util import pack_bitmask, random_bitmask

B = 6
# (id, V, dtype, sampling args): temperature per row mixes greedy and sampled rows
CASES = [
    ("greedy", 1000, torch.float32, dict(temperature=0.0)),
    ("sample", 1000, torch.float32, dict(temperature=[1.0, 0.5, 0.0, 2.0, 1.0, 0.7])),
    ("top-k", 777, torch.float32, dict(temperature=0.8, top_k=[1, 2, 5, 0, 40, 1000])),
    ("top-p", 1000, torch.bfloat16, dict(temperature=1.0, top_p=[0.1, 0.5, 0.9, 1.0, 0.99, 0.3])),
    ("min-p", 1003, torch.float16, dict(temperature=1.3, min_p=[0.0, 0.05, 0.2, 0.5, 1.0, 0.01])),
    (
        "joint",
        4099,
        torch.float32,
        dict(
            temperature=[0.9, 1.1, 0.0, 1.0, 0.6, 1.0],
            top_k=[50, 0, 5, 20, 3, 100],
            top_p=[0.9, 0.8, 1.0, 0.5, 0.95, 0.7],
            min_p=[0.05, 0.0, 0.1, 0.0, 0.0, 0.02],
        ),
    ),
]


def _inputs(V: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, V, generator=gen) * 3).to(dtype)
    bitmask = random_bitmask(B, V, 0.6, gen)
    bitmask[1] = 0  # nothing allowed
    one = torch.zeros(1, V, dtype=torch.bool)
    one[0, V - 1] = True  # only the last token (a partial word)
    bitmask[4] = pack_bitmask(one)[0]
    return logits, bitmask


def _run(impl, logits, bitmask=None, **kw):
    backend, device = impl
    kw.setdefault("seed", torch.arange(100, 100 + logits.shape[0]))
    kw.setdefault("step", 7)
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    mask = bitmask.to(device) if bitmask is not None else None
    out = kernels.sample(logits.to(device), bitmask=mask, backend=backend, **kw)
    return kernels.SampleOutput(*(t.cpu() if t is not None else None for t in out))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference(impl, case):
    _, V, dtype, args = case
    logits, bitmask = _inputs(V, dtype)
    want = _run(("torch", "cpu"), logits, bitmask, return_logprobs=True, **args)
    got = _run(impl, logits, bitmask, return_logprobs=True, **args)
    assert got.tokens.dtype == torch.int64 and got.empty.dtype == torch.bool
    torch.testing.assert_close(got.tokens, want.tokens, rtol=0, atol=0)
    torch.testing.assert_close(got.empty, want.empty)
    torch.testing.assert_close(got.logprobs, want.logprobs, rtol=1e-5, atol=1e-5)
    assert want.empty.tolist() == [False, True, False, False, False, False]
    assert want.tokens[1] == -1 and want.tokens[4] == V - 1
    allowed = unpack_bitmask(bitmask, V)
    for b in (0, 2, 3, 5):
        assert allowed[b, want.tokens[b]]


def test_greedy_lowest_id_on_ties(impl):
    logits = torch.zeros(3, 70)
    logits[0, [5, 9, 64]] = 2.0
    logits[1, [69, 33]] = 1.0
    logits[2] = float("-inf")
    logits[2, [40, 41]] = -3.0
    got = _run(impl, logits, temperature=0.0)
    assert got.tokens.tolist() == [5, 33, 40]


def test_same_seed_same_token_other_steps_differ(impl):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 500, generator=gen).expand(16, 500).contiguous()
    a = _run(impl, logits, temperature=1.0, seed=torch.full((16,), 3), step=torch.arange(16))
    b = _run(impl, logits, temperature=1.0, seed=torch.full((16,), 3), step=torch.arange(16))
    assert a.tokens.tolist() == b.tokens.tolist()
    assert len(set(a.tokens.tolist())) > 8  # 16 steps of a flat distribution: many different tokens
    c = _run(impl, logits, temperature=1.0, seed=torch.full((16,), 4), step=torch.arange(16))
    assert c.tokens.tolist() != a.tokens.tolist()


def test_batch_invariance(impl):
    V = 1500
    gen = torch.Generator().manual_seed(2)
    row = torch.randn(1, V, generator=gen) * 2
    row_mask = random_bitmask(1, V, 0.5, gen)
    args = dict(temperature=0.9, top_k=30, top_p=0.9, min_p=0.01, seed=12345, step=99)
    alone = _run(impl, row, row_mask, **args).tokens[0]
    for size, pos in [(2, 1), (5, 3), (9, 0)]:
        logits = torch.randn(size, V, generator=gen) * 2
        bitmask = random_bitmask(size, V, 0.5, gen)
        logits[pos], bitmask[pos] = row[0], row_mask[0]
        batch_args = dict(args, seed=torch.randint(0, 2**40, (size,), generator=gen))
        batch_args["seed"][pos] = 12345
        got = _run(impl, logits, bitmask, **batch_args).tokens
        assert got[pos] == alone, (size, pos)


def test_noncontiguous_logits(impl):
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(1001, 8, generator=gen) * 2  # logits = base.t(): strides (1, 8)
    bitmask = random_bitmask(8, 1001, 0.7, gen)
    args = dict(temperature=[0.0, 1.0] * 4, top_p=0.8, return_logprobs=True)
    got = _run(impl, base.t(), bitmask, **args)
    want = _run(impl, base.t().contiguous(), bitmask, **args)
    assert got.tokens.tolist() == want.tokens.tolist()
    sliced = torch.randn(8, 2002, generator=gen)[:, ::2]  # strides (2002, 2)
    got = _run(impl, sliced, **args)
    want = _run(("torch", "cpu"), sliced.contiguous(), **args)
    assert got.tokens.tolist() == want.tokens.tolist()


def test_indices_select_masked_rows(impl):
    V = 100
    logits = torch.zeros(4, V)
    logits[:, 7] = 5.0  # the unconstrained favourite
    allowed = torch.zeros(4, V, dtype=torch.bool)
    allowed[:, 50] = True
    got = _run(impl, logits, pack_bitmask(allowed), indices=[1, 3], temperature=0.0)
    assert got.tokens.tolist() == [7, 50, 7, 50]


def test_logits_not_modified(impl):
    logits, bitmask = _inputs(300, torch.float32)
    before = logits.clone()
    _run(impl, logits, bitmask, temperature=1.0, top_k=5)
    assert torch.equal(logits, before)


@pytest.mark.parametrize("V", [1000, 33, 4097])
def test_apply_bitmask(impl, V):
    backend, device = impl
    gen = torch.Generator().manual_seed(V)
    logits = torch.randn(5, V, generator=gen)
    bitmask = random_bitmask(5, V, 0.3, gen)
    want = kernels.apply_bitmask_(logits.clone(), bitmask, backend="torch")
    allowed = unpack_bitmask(bitmask, V)
    assert torch.equal(torch.isfinite(want), allowed)
    got = kernels.apply_bitmask_(logits.clone().to(device), bitmask.to(device), backend=backend).cpu()
    assert torch.equal(got, want)
    # index list, non-contiguous bf16 logits: other rows untouched
    big = torch.randn(5, 2 * V, generator=gen).to(torch.bfloat16)
    view = big.to(device)[:, ::2]
    out = kernels.apply_bitmask_(view, bitmask.to(device), [0, 3], backend=backend)
    assert out is view
    want = big[:, ::2].clone()
    want[[0, 3]] = want[[0, 3]].masked_fill(~allowed[[0, 3]], float("-inf"))
    assert torch.equal(view.cpu(), want)


@pytest.mark.parametrize("V", [1, 31, 32, 33, 1000, 4097, 49152])
def test_unpack_bitmask_matches_the_shifts(V):
    """The CPU unpack (numpy's unpackbits over the words' bytes) against the definition, on
    random words (every bit pattern, the sign bit included), rows of none, a width wider
    than V needs, and a strided view."""
    from deepinfer.kernels.bitmask_reference import unpack_bitmask_shifts

    gen = torch.Generator().manual_seed(V)
    W = (V + 31) // 32
    for B in (0, 1, 7):
        words = torch.randint(-(2**31), 2**31, (B, W + 1), dtype=torch.int32, generator=gen)
        for bitmask in (words[:, :W], words, words[:, :W].t().contiguous().t()):
            got = unpack_bitmask(bitmask, V)
            want = unpack_bitmask_shifts(bitmask, V)
            assert got.dtype == torch.bool and got.shape == want.shape
            assert torch.equal(got, want)
    allowed = torch.rand(3, V, generator=gen) < 0.4
    assert torch.equal(unpack_bitmask(pack_bitmask(allowed), V), allowed)


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="needs TRITON_INTERPRET=0")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llm_sized_rows_match_reference_on_gpu(dtype):
    B, V = 64, 128256
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(B, V, generator=gen) * 3).to(dtype)
    bitmask = random_bitmask(B, V, 0.5, gen)
    args = dict(
        temperature=torch.rand(B, generator=gen) + 0.3,
        top_k=torch.randint(0, 200, (B,), generator=gen),
        top_p=torch.rand(B, generator=gen) * 0.6 + 0.4,
        min_p=torch.rand(B, generator=gen) * 0.02,
        seed=torch.randint(0, 2**62, (B,), generator=gen),
        step=torch.arange(B),
        return_logprobs=True,
    )
    want = _run(("torch", "cpu"), logits, bitmask, **args)
    got = _run(("triton", "cuda"), logits, bitmask, **args)
    mismatches = (got.tokens != want.tokens).sum().item()
    assert mismatches == 0, f"{mismatches} of {B} rows differ"
    torch.testing.assert_close(got.logprobs, want.logprobs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference_small_tiles(impl, case):
    """Small tiles: every pass loops over many blocks (cross-block max, argmax and sums)."""
    backend, _ = impl
    if backend != "triton":
        pytest.skip("Triton tiling")
    _, V, dtype, args = case
    logits, bitmask = _inputs(V, dtype, seed=1)
    want = _run(("torch", "cpu"), logits, bitmask, return_logprobs=True, **args)
    got = _run(impl, logits, bitmask, return_logprobs=True, tuning=SampleTuning(block_max=64), **args)
    torch.testing.assert_close(got.tokens, want.tokens, rtol=0, atol=0)
    torch.testing.assert_close(got.empty, want.empty)
    torch.testing.assert_close(got.logprobs, want.logprobs, rtol=1e-5, atol=1e-5)


def test_exp_floor_leaves_the_quanta_and_sums_as_they_were():
    """The reference clamps exp's argument at EXP_FLOOR (torch's CPU exp is slow below it): the
    tokens' 2**32 quanta and chunk sums, the top-p normaliser, the tokens and the logprobs are
    those of the unclamped exp, on rows with masked tokens (-inf) and scores 80 to 10,000 below
    the max."""
    from deepinfer.kernels import sample_reference as ref

    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 5000, generator=g) * 3
    s[0, ::2] = float("-inf")
    s[1, 100:] -= torch.rand(4900, generator=g) * 1e4
    s[2, :2500] = -90.0 + torch.randn(2500, generator=g)
    low = torch.full((3,), float("-inf"))
    i64 = torch.zeros(3, dtype=torch.int64)
    args = dict(temperature=torch.ones(3), top_k=i64, top_p=torch.full((3,), 0.9), min_p=torch.zeros(3),
                seed=torch.arange(3), step=i64)  # fmt: skip
    m = s.max(dim=1, keepdim=True).values

    def run():
        return (*ref.chunk_weights(s, low, 1024), ref._exp(s - m).sum(dim=1),
                *ref.sample(s, None, None, **args, return_logprobs=True))  # fmt: skip

    got = run()
    floor = ref.EXP_FLOOR
    ref.EXP_FLOOR = float("-inf")
    try:
        want = run()
    finally:
        ref.EXP_FLOOR = floor
    assert bool((s - m < floor).any(dim=1).all())  # every row has scores below the floor
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_draw_bits_in_python_ints_are_the_tensor_hash(monkeypatch):
    """CPU calls of few rows hash in Python ints (sample_reference.HOST_DRAW_ROWS): the bits of the
    tensor hash, for seeds and steps over all of int64 (negative ones included)."""
    from deepinfer.kernels import sample_reference as ref

    g = torch.Generator().manual_seed(1)
    for B in (1, 3, ref.HOST_DRAW_ROWS):
        seed = torch.randint(-(2**63), 2**63 - 1, (B,), generator=g)
        step = torch.randint(-(2**63), 2**63 - 1, (B,), generator=g)
        step[0] = 0
        got = ref.draw_bits(seed, step, 12)
        with monkeypatch.context() as m:
            m.setattr(ref, "HOST_DRAW_ROWS", 0)  # the tensor hash
            want = ref.draw_bits(seed, step, 12)
        assert torch.equal(got, want)
    none = torch.zeros(0, dtype=torch.int64)
    assert ref.draw_bits(none, none, 8).shape == (0, 8)


def test_inverse_cdf_of_several_draws_is_each_draw_alone():
    """inverse_cdf with [R, n] draw bits gives, for each draw, the token it gives alone."""
    from deepinfer.kernels import sample_reference as ref

    g = torch.Generator().manual_seed(2)
    s = torch.randn(5, 3000, generator=g) * 4
    s[1, ::3] = float("-inf")
    s[2, 1000:] = float("-inf")  # whole chunks masked
    mc, q, z = ref.chunk_weights(s, torch.full((5,), float("-inf")), 512)
    t = ref.draw_bits(torch.arange(5), torch.full((5,), 7), 12)
    got = ref.inverse_cdf(mc, q, z, t[:, 0::2], t[:, 1::2])
    assert got.shape == (5, 6)
    for j in range(6):
        assert torch.equal(got[:, j], ref.inverse_cdf(mc, q, z, t[:, 2 * j], t[:, 2 * j + 1]))
    assert bool((s.gather(1, got) > float("-inf")).all())
