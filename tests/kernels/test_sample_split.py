"""The split pass 1 (one program per (row, chunk), then a per-row combine) against the torch
reference: greedy exactly (lowest id on ties, also across chunk borders), sampled rows with the
same tokens, empty rows, partial last chunks, bf16, strides, index lists, batch invariance."""

from __future__ import annotations

import pytest
import torch

from deepinfer import kernels
from deepinfer.kernels import SampleTuning

from ._util import pack_bitmask, random_bitmask
from .test_sample_exact import CASES, _inputs, _run

TRITON = ("triton", "cpu")


@pytest.fixture(autouse=True)
def _triton_only(impl):
    if impl[0] != "triton":
        pytest.skip("Triton split path")


@pytest.fixture(
    params=[
        ("always", 64, True),
        ("always", 64, False),
        ("always", 256, True),
        ("auto", 128, True),
        ("never", 64, True),
    ],
    ids=["s64", "s64-rowtest", "s256", "auto128", "off"],
)
def split(request) -> SampleTuning:
    """Split on with small chunks (many chunks per row, partial last chunk; the test pass split
    too, or in the per-row kernel), auto, and off; the chunks are the draws' (reference and
    kernel: both take the tuning)."""
    mode, chunk, split2 = request.param
    return SampleTuning(split=mode, split2=split2, chunk_max=chunk, block_max=128)


def _check(impl, logits, bitmask=None, **args):
    want = _run(("torch", "cpu"), logits, bitmask, return_logprobs=True, **args)
    got = _run(impl, logits, bitmask, return_logprobs=True, **args)
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.empty.tolist() == want.empty.tolist()
    torch.testing.assert_close(got.logprobs, want.logprobs, rtol=1e-5, atol=1e-5)
    return got


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_split_matches_reference(impl, split, case):
    _, V, dtype, args = case
    logits, bitmask = _inputs(V, dtype, seed=3)
    got = _check(impl, logits, bitmask, **args, tuning=split)
    assert got.tokens[1] == -1 and got.empty[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_split_greedy_random(impl, split, dtype):
    gen = torch.Generator().manual_seed(11)
    B, V = 7, 1000  # 1000 = 15 * 64 + 40: a partial last chunk
    # few distinct values: many ties, inside chunks and across chunk borders
    logits = torch.randint(-3, 4, (B, V), generator=gen).to(dtype)
    bitmask = random_bitmask(B, V, 0.3, gen)
    bitmask[2] = 0
    _check(impl, logits, bitmask, temperature=0.0, tuning=split)
    _check(impl, logits, temperature=0.0, tuning=split)
    _check(impl, (torch.randn(B, V, generator=gen) * 4).to(dtype), bitmask, temperature=0.0, tuning=split)


@pytest.mark.parametrize("chunk", [8, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_chunks_narrower_than_a_word(impl, chunk, dtype):
    """Chunks of 8 or 16 tokens: a row of the 2-D tile starts inside a bitmask word (greedy,
    sampling, top-k, top-p, min-p, partial last chunk and word)."""
    tuning = SampleTuning(split="always", split2=True, chunk_max=chunk)
    gen = torch.Generator().manual_seed(chunk)
    B, V = 6, 77
    logits = (torch.randn(B, V, generator=gen) * 2).to(dtype)
    bitmask = random_bitmask(B, V, 0.6, gen)
    bitmask[1] = 0
    one = torch.zeros(1, V, dtype=torch.bool)
    one[0, V - 1] = True
    bitmask[4] = pack_bitmask(one)[0]
    _check(impl, logits, bitmask, temperature=0.0, tuning=tuning)
    _check(impl, logits, bitmask, temperature=[1.0, 0.5, 0.0, 2.0, 1.0, 0.7], tuning=tuning)
    _check(
        impl,
        logits,
        bitmask,
        temperature=0.9,
        top_k=[1, 2, 3, 0, 4, 9],
        top_p=[0.5, 0.9, 1.0, 0.3, 0.8, 0.6],
        tuning=tuning,
    )
    _check(impl, logits, bitmask, temperature=1.2, min_p=[0.0, 0.1, 0.5, 0.2, 0.9, 0.05], tuning=tuning)


def test_split_greedy_ties_across_chunk_borders(impl, split):
    V = 300
    logits = torch.zeros(6, V)
    logits[0, [63, 64, 128]] = 5.0  # last of chunk 0 and first of chunk 1 (chunk 64)
    logits[1, [255, 256]] = 2.0  # last of chunk 3 and first of chunk 4
    logits[2, [299, 200]] = 1.0  # the last (partial) chunk and an earlier one
    logits[3] = float("-inf")  # all -inf: empty
    logits[4] = float("-inf")
    logits[4, [131, 130]] = -7.0
    logits[5, 64:] = 3.0  # a whole chunk of ties after a lower chunk
    got = _check(impl, logits, temperature=0.0, tuning=split)
    assert got.tokens.tolist() == [63, 255, 200, -1, 130, 64]
    assert got.empty.tolist() == [False, False, False, True, False, False]
    # the same ties under a mask that forbids the first of each pair
    allowed = torch.ones(6, V, dtype=torch.bool)
    allowed[0, 63] = allowed[1, 255] = allowed[2, 200] = False
    got = _check(impl, logits, pack_bitmask(allowed), temperature=0.0, tuning=split)
    assert got.tokens.tolist()[:3] == [64, 256, 299]


def test_split_all_masked_and_only_last_token(impl, split):
    V = 333
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(4))
    allowed = torch.zeros(4, V, dtype=torch.bool)
    allowed[1, V - 1] = True
    allowed[2, 0] = True
    allowed[3] = True
    got = _check(impl, logits, pack_bitmask(allowed), temperature=[0.0, 0.0, 1.0, 0.0], tuning=split)
    assert got.tokens.tolist()[:3] == [-1, V - 1, 0]
    got = _check(impl, logits, pack_bitmask(allowed), temperature=1.0, top_p=0.5, tuning=split)
    assert got.tokens.tolist()[:3] == [-1, V - 1, 0]


def test_split_noncontiguous_and_indices(impl, split):
    gen = torch.Generator().manual_seed(6)
    base = torch.randn(1001, 8, generator=gen) * 2  # base.t(): strides (1, 8)
    bitmask = random_bitmask(8, 1001, 0.4, gen)
    args = dict(temperature=[0.0, 1.0, 0.0, 0.5, 0.0, 0.0, 2.0, 0.0], top_p=0.8)
    _check(impl, base.t(), bitmask, **args, tuning=split)
    sliced = (torch.randn(8, 2002, generator=gen) * 2).to(torch.bfloat16)[:, ::2]
    _check(impl, sliced, bitmask, indices=[0, 3, 4], **args, tuning=split)
    _check(impl, sliced, bitmask, indices=[5], temperature=0.0, tuning=split)


def test_split_batch_invariance(impl, split):
    V = 777
    gen = torch.Generator().manual_seed(8)
    row = torch.randint(-2, 3, (1, V), generator=gen).float()  # ties
    row_mask = random_bitmask(1, V, 0.5, gen)
    for args in (dict(temperature=0.0), dict(temperature=0.9, top_k=30, top_p=0.9, min_p=0.01)):
        alone = _run(impl, row, row_mask, seed=12345, step=9, **args, tuning=split)
        for size, pos in [(2, 1), (5, 3), (9, 0)]:
            logits = torch.randint(-2, 3, (size, V), generator=gen).float()
            bitmask = random_bitmask(size, V, 0.5, gen)
            logits[pos], bitmask[pos] = row[0], row_mask[0]
            seed = torch.randint(0, 2**40, (size,), generator=gen)
            seed[pos] = 12345
            got = _run(impl, logits, bitmask, seed=seed, step=9, **args, tuning=split)
            assert got.tokens[pos] == alone.tokens[0], (size, pos, args)


def test_split_sampled_rows_match_reference(impl, split):
    gen = torch.Generator().manual_seed(9)
    B, V = 8, 1500
    logits = torch.randn(B, V, generator=gen) * 3
    bitmask = random_bitmask(B, V, 0.5, gen)
    args = dict(
        temperature=torch.rand(B, generator=gen) + 0.3,
        top_k=torch.randint(0, 60, (B,), generator=gen),
        top_p=torch.rand(B, generator=gen) * 0.6 + 0.4,
        min_p=torch.rand(B, generator=gen) * 0.05,
        seed=torch.randint(0, 2**62, (B,), generator=gen),
        step=torch.arange(B),
    )
    _check(impl, logits, bitmask, **args, tuning=split)


def test_split_is_chosen_by_shape():
    from deepinfer.kernels.sample_triton import use_split

    auto = SampleTuning(split="auto", chunk_max=4096)
    assert use_split(128256, auto) and use_split(49152, auto)
    assert not use_split(4096, auto) and not use_split(1000, auto)
    assert not use_split(128256, SampleTuning(split="never"))
    assert use_split(1000, SampleTuning(split="always"))
    with pytest.raises(ValueError, match="split"):
        SampleTuning(split="yes")
    with pytest.raises(ValueError, match="split2"):
        SampleTuning(split2="1")
    with pytest.raises(ValueError, match="chunk_max"):
        SampleTuning(chunk_max=100)
    assert kernels  # the package under test


def test_kinds_from_host_values():
    """kernels.sample works out which launches rows need from host values; device tensors
    (unreadable without a sync) mean "filter", which is always correct."""
    from deepinfer.kernels import sample_kinds as _kinds

    assert _kinds(0.0, 0, 1.0, 1000) == "greedy"
    assert _kinds([0.0, 0.7], 0, 1.0, 1000) == "sample"
    assert _kinds([0.0, 0.7], [0, 5], 1.0, 1000) == "top_k"  # every sampling row has top-k
    assert _kinds(0.7, 50, 0.9, 1000) == "top_k"
    assert _kinds([0.0, 0.7], 0, [1.0, 0.9], 1000) == "top_p"  # no top-k: the test pass skips counts
    assert _kinds([0.7, 0.7], [0, 5], [0.9, 1.0], 1000) == "filter"
    assert _kinds([0.7, 0.0], [0, 5], 1.0, 1000) == "sample"  # top-k on a greedy row only
    assert _kinds(0.7, 1000, 1.0, 1000) == "sample"  # top-k >= V keeps every token
    assert _kinds(torch.tensor([0.7]), 0, torch.tensor([0.9]), 1000) == "top_p"
    # with min_p known: "plain" when no sampling row has any filter
    assert _kinds([0.0, 0.7], 0, 1.0, 1000, 0.0) == "plain"
    assert _kinds([0.0, 0.7], 0, 1.0, 1000, [0.0, 0.1]) == "sample"
    assert _kinds([0.0, 0.7], 0, 1.0, 1000, [0.1, 0.0]) == "plain"  # min-p on a greedy row only
    assert _kinds([0.0, 0.7], 0, [1.0, 0.9], 1000, 0.0) == "top_p"
    assert _kinds(0.0, 0, 1.0, 1000, 0.0) == "greedy"
    assert _kinds(0.7, 0, 1.0, 1000, [0.0, 0.0, 0.0]) == "plain"  # (broadcast)
    assert _kinds([0.7, 0.7], 0, 1.0, 1000, [0.0, 0.0, 0.0]) == "filter"  # lengths 2 and 3


def test_kinds_from_lists_match_the_tensor_path():
    """sample_kinds reads lists of Python numbers without torch (an engine step's values): the
    same answer as from tensors, on random rows with broadcast scalars."""
    import random

    from deepinfer.kernels import sample_kinds as _kinds

    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 6)
        args = [[rng.choice(vals) for _ in range(n)] for vals in ([0.0, 0.7], [0, 5, 1000, 2000], [1.0, 0.9])]
        args = [a[0] if rng.random() < 0.3 else a for a in args]
        assert _kinds(*args, 1000) == _kinds(*(torch.tensor(a) for a in args), 1000), args
        min_p = [rng.choice([0.0, 0.0, 0.1]) for _ in range(n)]
        assert _kinds(*args, 1000, min_p) == _kinds(
            *(torch.tensor(a) for a in args), 1000, torch.tensor(min_p)
        )


def test_kinds_hint_gives_the_same_tokens(impl, split):
    """A batch sampled with the launches its kinds allow returns the tokens of the full path."""
    gen = torch.Generator().manual_seed(21)
    B, V = 5, 900
    logits = torch.randn(B, V, generator=gen) * 2
    for kinds, temperature, top_p in (
        ("greedy", 0.0, 1.0),
        ("plain", 0.8, 1.0),
        ("sample", 0.8, 1.0),
        ("top_p", 0.8, 0.6),
    ):
        full = _run(impl, logits, temperature=temperature, top_p=top_p, kinds="filter", tuning=split)
        got = _run(impl, logits, temperature=temperature, top_p=top_p, kinds=kinds, tuning=split)
        assert got.tokens.tolist() == full.tokens.tolist()
    with pytest.raises(ValueError, match="kinds"):
        _run(impl, logits, temperature=0.0, kinds="fast", tuning=split)


class _Launches:
    """A Triton kernel that counts its launches."""

    def __init__(self, kernel):
        self.kernel, self.n = kernel, 0

    def __getitem__(self, grid):
        self.n += 1
        return self.kernel[grid]


@pytest.mark.parametrize("logprobs", [False, True])
def test_plain_hint_two_launches(impl, split, monkeypatch, logprobs):
    """kinds="plain" (no sampling row has a filter): with the split, pass 1 and one program a
    row that draws (or takes a greedy row's argmax) and ends the row -- no draw kernel, no
    per-row kernel. Greedy and sampling rows, a row the mask empties, a scattered mask: the
    tokens, flags and logprobs of the full path and of the reference."""
    from deepinfer.kernels import sample_rows, sample_split

    draws = _Launches(sample_split._split_draw_kernel)
    rows = _Launches(sample_rows._sample_kernel)
    monkeypatch.setattr(sample_split, "_split_draw_kernel", draws)
    monkeypatch.setattr(sample_rows, "_sample_kernel", rows)
    gen = torch.Generator().manual_seed(23)
    B, V = 6, 900
    logits = torch.randn(B, V, generator=gen) * 2
    allowed = torch.rand(B, V, generator=gen) < 0.4
    allowed[1] = True
    allowed[3] = False  # -> -1, empty
    bitmask = pack_bitmask(allowed)
    args = dict(temperature=torch.tensor([0.8, 0.0, 1.3, 0.8, 0.5, 0.0]), return_logprobs=logprobs)
    want = _run(("torch", "cpu"), logits, bitmask, **args, tuning=split)
    full = _run(impl, logits, bitmask, kinds="filter", **args, tuning=split)
    launches = (draws.n, rows.n)
    got = _run(impl, logits, bitmask, kinds="plain", **args, tuning=split)
    assert got.tokens.tolist() == full.tokens.tolist() == want.tokens.tolist()
    assert got.empty.tolist() == want.empty.tolist() and want.tokens[3] == -1
    if logprobs:
        torch.testing.assert_close(got.logprobs, full.logprobs, rtol=0, atol=0)
        torch.testing.assert_close(got.logprobs, want.logprobs, rtol=1e-5, atol=1e-5)
    if split.split != "never":  # the split: the full path's draw and per-row launches are left out
        assert launches == (1, 1) and (draws.n, rows.n) == launches, (launches, draws.n, rows.n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_hint_one_launch(impl, split, dtype):
    """kinds="greedy" without logprobs: with the split, one launch (each chunk's argmax; the
    row's last program to finish takes them in chunk order; bf16 through one int32 max of packed
    value and index). The reference's tokens exactly: a tie across chunks and one inside a chunk
    (lowest id), negative maxima, -0.0 beside +0.0, an all -inf row, a row the mask empties, a
    scattered mask; twice (the per-row counts are left at zero for the next call)."""
    from deepinfer.kernels import sample_greedy

    gen = torch.Generator().manual_seed(5)
    B, V = 7, 700
    logits = (torch.randn(B, V, generator=gen) * 3).to(dtype)
    top = logits.float().max() + 1
    logits[0, 650], logits[0, 100], logits[0, 101] = top, top, top  # -> 100
    logits[1] = -5.0
    logits[1, 300], logits[1, 299], logits[1, 5] = -1.0, -1.0, -1.5  # -> 299
    logits[2] = -1.0
    logits[2, 20], logits[2, 10] = 0.0, -0.0  # equal: -> 10
    logits[3] = float("-inf")  # -> -1, empty
    allowed = torch.rand(B, V, generator=gen) < 0.3
    allowed[:4] = True
    allowed[5] = False  # -> -1, empty
    bitmask = pack_bitmask(allowed)
    want = _run(("torch", "cpu"), logits, bitmask, temperature=0.0, tuning=split)
    assert want.tokens[:4].tolist() == [100, 299, 10, -1] and want.tokens[5] == -1
    for _ in range(2):
        got = _run(impl, logits, bitmask, temperature=0.0, kinds="greedy", tuning=split)
        assert got.tokens.tolist() == want.tokens.tolist()
        assert got.empty.tolist() == want.empty.tolist()
    for buf in sample_greedy._counts.values():
        assert int(buf.abs().sum()) == 0


def test_split_top_p_on_peaked_rows(impl, split):
    """Peaked rows (the mass in a few tokens of one chunk, every other chunk far below, as a
    real model's logits) give the reference's tokens and logprobs for top-p, top-k and both,
    with the peak in the first, a middle and the partial last chunk."""
    gen = torch.Generator().manual_seed(31)
    B, V = 9, 1000  # chunk 64: 16 chunks, the last partial
    logits = torch.randn(B, V, generator=gen) - 20.0
    for b, at in enumerate([3, 500, 990] * 3):
        logits[b, at : at + 5] = torch.tensor([6.0, 5.5, 5.0, 4.0, 6.0])  # a tie at the top too
    args = dict(
        temperature=1.0,
        top_p=torch.tensor([0.5, 0.9, 0.99] * 3),
        top_k=torch.tensor([0, 0, 0, 2, 3, 1, 2, 4, 5]),
        seed=torch.arange(B) * 131,
        step=torch.arange(B),
    )
    got = _check(impl, logits, **args, tuning=split)
    for b, at in enumerate([3, 500, 990] * 3):
        assert at <= int(got.tokens[b]) < at + 5
    _check(impl, logits, random_bitmask(B, V, 0.7, gen), **args, tuning=split)


def test_dependent_launch_only_where_it_exists(monkeypatch):
    """Programmatic dependent launch is asked for only on a CUDA device of capability 9 or later
    with a Triton that has it, never under the interpreter or on the CPU; the answer is kept per
    device."""
    from deepinfer.kernels import triton_common as tc

    monkeypatch.setattr(tc, "_pdl_ok", {})
    assert not tc.pdl_device(torch.device("cpu"))
    if tc.INTERPRET or not torch.cuda.is_available():
        assert tc._pdl_ok == {torch.device("cpu"): False}
        return
    dev = torch.device("cuda", torch.cuda.current_device())
    assert tc.pdl_device(dev) == (tc.HAS_PDL and torch.cuda.get_device_capability(dev)[0] >= 9)
