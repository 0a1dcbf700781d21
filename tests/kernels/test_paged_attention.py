"""Paged attention (kernels/paged_attention.py): the Triton kernel and the torch path (batched and
per-row) against the float64 reference, through shuffled block tables with garbage in the null
block and past each sequence's length; a row's bits alone vs inside a batch; argument checks.
The per-token kernel split over the keys (``splits``) against the reference, with windows and
soft-caps, its bits alone vs in a batch and at any table width, its counters left at 0.
The query-tiled prefill kernel against the reference and the per-token kernel, and its checks.

TRITON_INTERPRET=1 must be set before the Triton kernel is imported so that it runs on CPU; on a
GPU machine run with TRITON_INTERPRET=0 (the CUDA rows are marked gpu)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deepinfer.kernels.paged_attention import (  # noqa: E402
    decode_keys,
    paged_attention_reference,
    paged_attention_torch,
    paged_attention_triton,
    paged_decode_torch,
    paged_prefill_triton,
)

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]
IMPLS = ["triton", "torch", "torch_rows"]  # torch_rows: paged_attention_torch(per_row=True)
SHAPES = [(2, 1, 64), (1, 4, 80), (1, 8, 128)]  # (kv heads, query heads per kv head, head_dim)
# (seq_len, query rows): decode rows of 1 key, 37 keys and 70 (past a Triton block), a chunk of
# 5 new tokens after 15 cached, a whole prefill of 9
MIXED = [(1, 1), (37, 1), (70, 1), (20, 5), (9, 9)]


@dataclass
class Batch:
    q: torch.Tensor  # [N, nkv, g, hd]
    k_cache: torch.Tensor  # [num_blocks, bs, nkv, hd]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, W], row b = sequence b
    query_start: list[int]
    seq_lens: list[int]

    @property
    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(seq_ids, positions) [N] int64: each sequence's rows are its newest tokens."""
        seq_ids, positions = [], []
        for b, n in enumerate(self.seq_lens):
            T = self.query_start[b + 1] - self.query_start[b]
            seq_ids += [b] * T
            positions += range(n - T, n)
        dev = self.q.device
        return torch.tensor(seq_ids, device=dev), torch.tensor(positions, device=dev)


def _batch(specs, nkv, g, hd, bs, dtype, device, garbage=float("nan"), seed=0) -> Batch:
    """Sequences (seq_len, rows) with their blocks at shuffled ids (never 0), tables padded with
    the null block 0 up to one spare column; ``garbage`` in block 0, in the slots past each
    sequence's length and in the spare blocks."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n, _ in specs]
    num_blocks = 1 + sum(need) + 3
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(specs), max(need) + 1, dtype=torch.int32)
    k_cache = torch.randn(num_blocks, bs, nkv, hd, generator=gen)
    v_cache = torch.randn(num_blocks, bs, nkv, hd, generator=gen)
    used = torch.zeros(num_blocks, bs, dtype=torch.bool)
    for b, (n, _) in enumerate(specs):
        for i in range(need[b]):
            table[b, i] = blk = ids.pop()
            used[blk, : min(bs, n - i * bs)] = True
    k_cache[~used], v_cache[~used] = garbage, garbage
    N = sum(T for _, T in specs)
    q = torch.randn(N, nkv, g, hd, generator=gen)
    starts = [0]
    for _, T in specs:
        starts.append(starts[-1] + T)
    q, k_cache, v_cache = (t.to(device, dtype) for t in (q, k_cache, v_cache))
    return Batch(q, k_cache, v_cache, table.to(device), starts, [n for n, _ in specs])


def _run(impl: str, x: Batch) -> torch.Tensor:
    if impl == "triton":
        if (x.q.device.type == "cpu") != INTERPRET:
            pytest.skip("Triton runs on CPU only under TRITON_INTERPRET=1, on CUDA only without it")
        return paged_attention_triton(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows)
    return paged_attention_torch(
        x.q, x.k_cache, x.v_cache, x.block_tables, x.query_start, x.seq_lens, per_row=impl == "torch_rows"
    )


def _check(impl: str, x: Batch, dtype: torch.dtype) -> torch.Tensor:
    got = _run(impl, x)
    assert got.shape == x.q.shape and got.dtype == dtype
    assert not got.isnan().any()
    want = paged_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=0)
    return got


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("nkv", "g", "hd"), SHAPES)
@pytest.mark.parametrize("bs", [16, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_call_matches_reference(device, impl, nkv, g, hd, bs, dtype):
    """Decode rows beside a multi-row chunk and a whole prefill, NaN in every unread slot."""
    _check(impl, _batch(MIXED, nkv, g, hd, bs, dtype, device), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_chunk_matches_reference(device, impl, dtype):
    """One sequence: 24 new tokens at positions 76..99 after 76 cached keys (1e4 as garbage)."""
    _check(impl, _batch([(100, 24)], 2, 2, 64, 16, dtype, device, garbage=1e4), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bs", [1, 16, 128])
def test_garbage_and_table_dtype_do_not_change_bits(device, impl, bs):
    """NaN, 1e4 or zeros in the unread slots, an int32 or int64 table: the same bits (block sizes
    below, at and above a Triton block of keys)."""
    specs = [(3, 1), (21, 1), (70, 4)]
    x = _batch(specs, 1, 2, 64, bs, torch.float32, device)
    a = _check(impl, x, torch.float32)
    for garbage in (1e4, 0.0):
        y = _batch(specs, 1, 2, 64, bs, torch.float32, device, garbage=garbage)
        assert torch.equal(_run(impl, y), a)
    assert torch.equal(_run(impl, replace(x, block_tables=x.block_tables.long())), a)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", ["triton", "torch_rows"])
def test_row_bits_do_not_depend_on_the_batch(device, impl):
    """Sequence 1 of a batch alone, and inside a batch in another order (at another index, with
    another table row): the same bits."""
    specs = [(37, 1), (70, 3), (5, 1), (90, 1), (16, 6)]
    x = _batch(specs, 2, 3, 64, 16, torch.bfloat16, device)
    a = _run(impl, x)
    s, e = x.query_start[1], x.query_start[2]
    alone = replace(
        x, q=x.q[s:e], block_tables=x.block_tables[1:2], query_start=[0, e - s], seq_lens=[x.seq_lens[1]]
    )
    assert torch.equal(_run(impl, alone), a[s:e])
    order = [4, 3, 1, 0, 2]  # sequence 1 at index 2, after 7 rows
    starts = [0]
    for b in order:
        starts.append(starts[-1] + x.query_start[b + 1] - x.query_start[b])
    shuffled = replace(
        x,
        q=torch.cat([x.q[x.query_start[b] : x.query_start[b + 1]] for b in order]),
        block_tables=x.block_tables[order],
        query_start=starts,
        seq_lens=[x.seq_lens[b] for b in order],
    )
    assert torch.equal(_run(impl, shuffled)[starts[2] : starts[3]], a[s:e])


@pytest.mark.parametrize("specs", [[(37, 1)], [(1, 1), (37, 1), (70, 1), (16, 1)], [(5, 1), (5, 1)]])
@pytest.mark.parametrize("window", [0, 20])
@pytest.mark.parametrize("softcap", [0.0, 30.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_rows_match_reference(specs, window, softcap, dtype):
    """The CPU decode step's attention (`decode_keys` once, `paged_decode_torch` per layer): rows
    of one token, of one and several lengths, with and without a window and a soft-cap, through
    shuffled blocks with NaN in every slot no row reads; against the float64 reference."""
    x = _batch(specs, 2, 3, 64, 16, dtype, "cpu")
    keys = decode_keys(x.block_tables, x.seq_lens, 16, window)
    flat = [c.view(-1, 2, 64) for c in (x.k_cache, x.v_cache)]
    got = paged_decode_torch(x.q, *flat, keys, softcap)
    assert got.shape == x.q.shape and got.dtype == dtype and not got.isnan().any()
    want = paged_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows, window=window,
                                     softcap=softcap)  # fmt: skip
    torch.testing.assert_close(got.double(), want, atol=1e-5 if dtype == torch.float32 else 3e-2, rtol=0)


def test_decode_row_in_consecutive_blocks_is_read_as_a_view():
    """One row whose blocks follow each other: its keys are a slice of the cache (no gather), with
    the bits of the gathered read."""
    x = _batch([(40, 1)], 1, 4, 64, 16, torch.float32, "cpu")
    flat = [c.view(-1, 1, 64) for c in (x.k_cache, x.v_cache)]
    for c in (x.k_cache, x.v_cache):  # the row's blocks copied to ids 2, 3, 4
        c[2:5] = c[x.block_tables[0, :3].long()].clone()
    tables = torch.tensor([[2, 3, 4, 0]], dtype=torch.int32)
    for window in (0, 20):
        keys = decode_keys(tables, x.seq_lens, 16, window)
        assert keys.start == (32 if not window else 32 + 20) and keys.mask is None
        got = paged_decode_torch(x.q, *flat, keys)
        assert torch.equal(got, paged_decode_torch(x.q, *flat, keys._replace(start=None)))
        moved = replace(x, block_tables=tables)
        want = paged_attention_reference(x.q, x.k_cache, x.v_cache, tables, *moved.rows, window=window)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    assert decode_keys(x.block_tables, x.seq_lens, 16).start is None  # (shuffled blocks: gathered)


@pytest.mark.parametrize("device", DEVICES)
def test_triton_rows_of_any_order(device):
    """Triton rows name their own sequence and position: the rows of one call in reverse order, one
    of them repeated, and a row alone give the same bits as the call."""
    x = _batch(MIXED, 1, 4, 80, 16, torch.bfloat16, device)
    a = _run("triton", x)
    seq_ids, positions = x.rows
    idx = torch.tensor([*range(len(seq_ids) - 1, -1, -1), 6], device=x.q.device)
    b = paged_attention_triton(x.q[idx], x.k_cache, x.v_cache, x.block_tables, seq_ids[idx], positions[idx])
    assert torch.equal(b, a[idx])
    c = paged_attention_triton(x.q[6:7], x.k_cache, x.v_cache, x.block_tables, seq_ids[6:7], positions[6:7])
    assert torch.equal(c[0], a[6])


def _bad(x: Batch, what: str):
    """(function, args) of a call with one bad argument."""
    seq_ids, positions = x.rows
    args = dict(q=x.q, k_cache=x.k_cache, v_cache=x.v_cache, block_tables=x.block_tables)
    rows = dict(seq_ids=seq_ids, positions=positions)
    varlen = dict(query_start=x.query_start, seq_lens=x.seq_lens)
    nb, bs, nkv, hd = x.k_cache.shape
    wide = torch.zeros(nb, bs, nkv, 2 * hd, dtype=x.k_cache.dtype)  # every other element: stride 2
    changes = {
        "q_3d": dict(q=x.q[0]),
        "cache_hd": dict(k_cache=x.k_cache[..., :32], v_cache=x.v_cache[..., :32]),
        "v_shape": dict(v_cache=x.v_cache[:-1]),
        "cache_dtype": dict(k_cache=x.k_cache.double(), v_cache=x.v_cache.double()),
        "cache_stride": dict(k_cache=wide[..., ::2]),
        "table_dtype": dict(block_tables=x.block_tables.float()),
        "table_1d": dict(block_tables=x.block_tables[0]),
        "seq_ids_len": dict(seq_ids=seq_ids[:-1]),
        "positions_dtype": dict(positions=positions.float()),
        "block_size": dict(k_cache=x.k_cache[:, :3], v_cache=x.v_cache[:, :3]),
        "query_start": dict(query_start=[0, *x.query_start[2:]]),
        "seq_len_short": dict(seq_lens=[0, *x.seq_lens[1:]]),
        "table_narrow": dict(block_tables=x.block_tables[:, :1]),
    }
    change = changes[what]
    if "query_start" in change or "seq_lens" in change or what == "table_narrow":
        return paged_attention_torch, {**args, **varlen, **change}
    return paged_attention_triton, {**args, **rows, **change}


BAD = [  # (what, match); each for the Triton function unless it is about the varlen arguments
    ("q_3d", r"expected q of shape \[N, nkv, g, hd\]"),
    ("cache_hd", r"expected k_cache of shape \[num_blocks, block_size, 1, 64\]"),
    ("v_shape", "expected v_cache of k_cache's shape"),
    ("cache_dtype", "expected k_cache and v_cache in q's dtype"),
    ("cache_stride", "contiguous in head_dim"),
    ("table_dtype", "expected block_tables int32 or int64"),
    ("table_1d", "expected block_tables int32 or int64 of shape"),
    ("seq_ids_len", r"expected seq_ids int64 \(or int32\) of shape \[4\]"),
    ("positions_dtype", "expected positions int64"),
    ("block_size", "expected block_size .* a power of two, got 3"),
    ("query_start", "expected query_start of 3 offsets from 0 to 4"),
    ("seq_len_short", "sequence 0 has 1 query rows but seq_len 0"),
    ("table_narrow", "sequence 1's 20 keys need 2 blocks of 16, more than the table's 1"),
]


@pytest.mark.parametrize(("what", "match"), BAD, ids=[w for w, _ in BAD])
def test_bad_arguments_raise(what, match):
    x = _batch([(5, 1), (20, 3)], 1, 2, 64, 16, torch.float32, "cpu")
    fn, kwargs = _bad(x, what)
    with pytest.raises(ValueError, match=match):
        fn(**kwargs)


def test_triton_empty_call():
    x = _batch([(5, 1)], 1, 2, 64, 16, torch.float32, "cpu")
    e = torch.zeros(0, dtype=torch.int64)
    got = paged_attention_triton(x.q[:0], x.k_cache, x.v_cache, x.block_tables, e, e)
    assert got.shape == (0, 1, 2, 64)


# ---------------------------------------------------------------- split over the keys

# (seq_len, rows): one key; a block exactly; past it; runs of unequal length (5 blocks: 2 + 2 + 1
# at splits=3); 2 rows of one sequence (a verify's positions), lengths not a multiple of a block
SPLIT_SPECS = [(1, 1), (64, 1), (70, 1), (300, 1), (150, 2)]


def _split(x: Batch, splits: int, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    if (x.q.device.type == "cpu") != INTERPRET:
        pytest.skip("Triton runs on CPU only under TRITON_INTERPRET=1, on CUDA only without it")
    return paged_attention_triton(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows, window=window,
                                  softcap=softcap, splits=splits)  # fmt: skip


def _counters_at_zero(device) -> bool:
    from deepinfer.kernels.paged_attention_triton import _COUNTERS

    return all(not c.any() for c in _COUNTERS.get(torch.device(device), []))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("nkv", "g", "hd", "dtype"), [(2, 1, 16, torch.float32), (1, 4, 80, torch.bfloat16)])
def test_split_matches_reference(device, nkv, g, hd, dtype):
    """Rows of every kind of length, at 3 and SPLITS (16) runs at most, plain, windowed (a window
    inside a block, one crossing blocks and past some rows, soft-capped); NaN in every unread
    slot. The kernel leaves its counters at 0."""
    from deepinfer.kernels.paged_attention import SPLITS

    x = _batch(SPLIT_SPECS, nkv, g, hd, 16, dtype, device)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for splits, window, softcap in [(3, 0, 0.0), (SPLITS, 0, 0.0), (3, 5, 0.0), (2, 100, 1.5)]:
        got = _split(x, splits, window, softcap)
        assert got.shape == x.q.shape and got.dtype == dtype
        want = paged_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows, window=window,
                                         softcap=softcap)  # fmt: skip
        torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=0, msg=f"splits {splits}, "
                                   f"window {window}, softcap {softcap}")  # fmt: skip
    assert _counters_at_zero(device)


@pytest.mark.parametrize("device", DEVICES)
def test_split_row_bits_do_not_depend_on_batch_or_table_width(device):
    """A row's bits: alone, inside the batch at another index (another table row), with a wider
    table (more programs a row in the grid), and called again: the same. Rows of one run have
    the unsplit kernel's bits."""
    x = _batch(SPLIT_SPECS, 1, 3, 64, 16, torch.bfloat16, device)
    a = _split(x, 3)
    seq_ids, positions = x.rows
    for i in (3, 5):  # 300 keys, and the second row of a sequence
        table, one = x.block_tables[seq_ids[i]][None], slice(i, i + 1)
        alone = paged_attention_triton(x.q[one], x.k_cache, x.v_cache, table, torch.zeros_like(seq_ids[one]),
                                       positions[one], splits=3)  # fmt: skip
        assert torch.equal(alone[0], a[i]), i
    order = torch.tensor([3, 0, 4, 1, 2], device=x.q.device)  # sequence b -> table row where[b]
    where = torch.argsort(order)
    rows = torch.arange(x.q.shape[0] - 1, -1, -1, device=x.q.device)  # the rows reversed
    got = paged_attention_triton(x.q[rows], x.k_cache, x.v_cache, x.block_tables[order], where[seq_ids[rows]],
                                 positions[rows], splits=3)  # fmt: skip
    assert torch.equal(got, a[rows])
    wide = torch.cat([x.block_tables, torch.zeros_like(x.block_tables)], dim=1)
    assert torch.equal(
        paged_attention_triton(x.q, x.k_cache, x.v_cache, wide, seq_ids, positions, splits=3), a
    )
    assert torch.equal(_split(x, 3), a)
    one_run = (positions < 64).tolist()  # keys in one block: one run
    b = _split(x, 1)
    assert all(torch.equal(a[i], b[i]) for i, one in enumerate(one_run) if one)
    assert _counters_at_zero(device)


def test_split_bad_argument_raises():
    x = _batch([(5, 1)], 1, 2, 64, 16, torch.float32, "cpu")
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="expected splits a host int >= 1"):
            paged_attention_triton(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows, splits=bad)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs TRITON_INTERPRET=0")
def test_split_on_cuda_many_rows_and_launches():
    """On CUDA, Llama-3-8B's head shape: 24 rows of 1 to 2600 keys (up to 41 blocks: 14 runs of
    3), launched 20 times: every launch the same bits (the merge is in run order whichever program
    ends last), close to the reference, a row alone the same bits, the counters at 0."""
    gen = torch.Generator().manual_seed(3)
    lens = torch.randint(1, 2600, (24,), generator=gen).tolist()
    x = _batch([(n, 1) for n in lens], 8, 4, 128, 16, torch.bfloat16, "cuda")
    a = _split(x, 16)
    for _ in range(20):
        assert torch.equal(_split(x, 16), a)
    want = paged_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows)
    torch.testing.assert_close(a.double().cpu(), want, atol=3e-2, rtol=0)
    seq_ids, positions = x.rows
    for i in (0, 17, 23):
        one = slice(i, i + 1)
        alone = paged_attention_triton(x.q[one], x.k_cache, x.v_cache, x.block_tables, seq_ids[one],
                                       positions[one], splits=16)  # fmt: skip
        assert torch.equal(alone[0], a[i])
    torch.cuda.synchronize()
    assert _counters_at_zero("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs TRITON_INTERPRET=0")
def test_split_in_a_cuda_graph():
    """Captured once (after a warm-up call), replayed as the rows grow by a key a step: each
    replay the bits of an eager call at those lengths."""
    x = _batch([(200, 1), (1000, 1), (70, 1), (45, 1)], 8, 4, 128, 16, torch.bfloat16, "cuda")
    seq_ids, positions = x.rows
    pos = (positions - 40).clone()  # (every row keeps a key: a row of none would give NaN)
    call = lambda: paged_attention_triton(x.q, x.k_cache, x.v_cache, x.block_tables, seq_ids, pos,  # noqa: E731
                                          splits=16)  # fmt: skip
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for _ in range(40):
        pos += 1
        graph.replay()
        assert torch.equal(out, call())
    torch.cuda.synchronize()
    assert _counters_at_zero("cuda")


# ---------------------------------------------------------------- paged_prefill_triton

PREFILL_SHAPES = [(2, 1, 64), (1, 4, 80), (2, 8, 128)]
LONG = 2  # the index of the chunk of several query tiles


def _prefill_specs(g: int, hd: int, dtype: torch.dtype) -> list[tuple[int, int]]:
    """(seq_len, query rows): 37 new tokens after 15 cached, a sequence without rows (skipped),
    BLOCK_M + 21 new tokens after 70 cached (several query tiles, each starting past a block of
    keys that every row sees), a decode row after 69 keys, a whole prefill of 40."""
    from deepinfer.kernels.paged_prefill_triton import config

    T = config(g, hd, dtype == torch.float32)[0] + 21
    return [(52, 37), (23, 0), (70 + T, T), (70, 1), (40, 40)]


def _prefill(x: Batch, max_query_len: int | None = None, index_dtype=torch.int64) -> torch.Tensor:
    """paged_prefill_triton on a batch; max_query_len defaults to 45 more than needed (programs
    past every sequence's rows)."""
    if (x.q.device.type == "cpu") != INTERPRET:
        pytest.skip("Triton runs on CPU only under TRITON_INTERPRET=1, on CUDA only without it")
    if max_query_len is None:
        max_query_len = max(b - a for a, b in zip(x.query_start, x.query_start[1:])) + 45
    dev = x.q.device
    qs = torch.tensor(x.query_start, dtype=index_dtype, device=dev)
    lens = torch.tensor(x.seq_lens, dtype=index_dtype, device=dev)
    return paged_prefill_triton(x.q, x.k_cache, x.v_cache, x.block_tables, qs, lens, max_query_len)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("nkv", "g", "hd"), PREFILL_SHAPES)
@pytest.mark.parametrize("bs", [16, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_matches_reference(device, nkv, g, hd, bs, dtype):
    """A fresh prefill, a chunk after a cached prefix, a decode row, a sequence without rows and a
    chunk of several query tiles in one call, NaN in every unread slot."""
    x = _batch(_prefill_specs(g, hd, dtype), nkv, g, hd, bs, dtype, device)
    got = _prefill(x)
    assert got.shape == x.q.shape and got.dtype == dtype
    assert not got.isnan().any()
    want = paged_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("nkv", "g", "hd"), PREFILL_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_matches_per_token_kernel(device, nkv, g, hd, dtype):
    """The per-token kernel on every row but some of the long chunk's: it keeps those at its
    first two query tiles' edges, its last and every 7th (the per-token kernel is slow under the
    interpreter)."""
    from deepinfer.kernels.paged_prefill_triton import config

    x = _batch(_prefill_specs(g, hd, dtype), nkv, g, hd, 4, dtype, device)
    got = _prefill(x)
    s, e = x.query_start[LONG], x.query_start[LONG + 1]
    block_m = config(g, hd, dtype == torch.float32)[0]
    picked = {block_m - 1, block_m, 2 * block_m - 1, 2 * block_m, e - s - 1, *range(3, e - s, 7)}
    long_rows = sorted(s + t for t in picked if t < e - s)
    idx = torch.tensor([*range(s), *long_rows, *range(e, x.q.shape[0])], device=x.q.device)
    seq_ids, positions = x.rows
    want = paged_attention_triton(
        x.q[idx], x.k_cache, x.v_cache, x.block_tables, seq_ids[idx], positions[idx]
    )
    if dtype == torch.float32:
        torch.testing.assert_close(got[idx], want, atol=1e-5, rtol=0)
    else:  # each rounds to bfloat16 (1 ulp apart at most), after 16-bit p @ v on a GPU
        torch.testing.assert_close(got[idx].float(), want.float(), atol=2e-2, rtol=1.6e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_bits_do_not_depend_on_garbage_index_dtypes_or_grid(device):
    """NaN, 1e4 or zeros in the unread slots, int32 or int64 tables and offsets, max_query_len
    exact or larger, q contiguous or a strided view (as the model slices it from q|k|v): the
    same bits."""
    specs = _prefill_specs(4, 64, torch.bfloat16)
    x = _batch(specs, 1, 4, 64, 16, torch.bfloat16, device)
    a = _prefill(x)
    for garbage in (1e4, 0.0):
        assert torch.equal(_prefill(_batch(specs, 1, 4, 64, 16, torch.bfloat16, device, garbage=garbage)), a)
    assert torch.equal(_prefill(replace(x, block_tables=x.block_tables.long()), index_dtype=torch.int32), a)
    assert torch.equal(_prefill(x, max_query_len=max(T for _, T in specs)), a)
    qkv = torch.cat([x.q.flatten(1), torch.zeros_like(x.q.flatten(1))], dim=1)  # [N, 2 * 4 * 64]
    strided = qkv[:, : 4 * 64].view(x.q.shape)
    assert not strided.is_contiguous()
    assert torch.equal(_prefill(replace(x, q=strided)), a)


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_without_rows(device):
    """No rows at all (N = 0), and sequences that all have 0 rows: an empty result."""
    x = _batch([(5, 0), (20, 0)], 1, 2, 64, 16, torch.float32, device)
    assert _prefill(x, max_query_len=0).shape == (0, 1, 2, 64)
    assert _prefill(x, max_query_len=3).shape == (0, 1, 2, 64)


def _bad_prefill(x: Batch, what: str) -> dict:
    """The kwargs of a paged_prefill_triton call with one bad argument."""
    qs = torch.tensor(x.query_start)
    lens = torch.tensor(x.seq_lens)
    args = dict(q=x.q, k_cache=x.k_cache, v_cache=x.v_cache, block_tables=x.block_tables, query_start=qs,
                seq_lens=lens, max_query_len=3)  # fmt: skip
    changes = {
        "q_3d": dict(q=x.q[0]),
        "cache_hd": dict(k_cache=x.k_cache[..., :32], v_cache=x.v_cache[..., :32]),
        "cache_dtype": dict(k_cache=x.k_cache.double(), v_cache=x.v_cache.double()),
        "q_int": dict(q=x.q.int(), k_cache=x.k_cache.int(), v_cache=x.v_cache.int()),
        "block_size": dict(k_cache=x.k_cache[:, :3], v_cache=x.v_cache[:, :3]),
        "table_dtype": dict(block_tables=x.block_tables.float()),
        "table_rows": dict(block_tables=x.block_tables[:1]),
        "seq_lens_2d": dict(seq_lens=lens[None]),
        "seq_lens_dtype": dict(seq_lens=lens.float()),
        "query_start_len": dict(query_start=qs[1:]),
        "query_start_list": dict(query_start=x.query_start),
        "query_start_dtype": dict(query_start=qs.float()),
        "max_query_len_tensor": dict(max_query_len=torch.tensor(3)),
        "max_query_len_negative": dict(max_query_len=-1),
        "max_query_len_zero": dict(max_query_len=0),
        "no_sequences": dict(query_start=qs[:1], seq_lens=lens[:0]),
        "device": dict(seq_lens=lens.to("meta")),
    }
    return {**args, **changes[what]}


BAD_PREFILL = [
    ("q_3d", r"expected q of shape \[N, nkv, g, hd\]"),
    ("cache_hd", r"expected k_cache of shape \[num_blocks, block_size, 1, 64\]"),
    ("cache_dtype", "expected k_cache and v_cache in q's dtype"),
    ("q_int", "expected q float32, bfloat16 or float16"),
    ("block_size", "expected block_size .* a power of two, got 3"),
    ("table_dtype", "expected block_tables int32 or int64"),
    ("table_rows", r"expected a block_tables row per sequence \(2\), got 1"),
    ("seq_lens_2d", r"expected seq_lens int32 or int64 of shape \[B\]"),
    ("seq_lens_dtype", "expected seq_lens int32 or int64"),
    ("query_start_len", r"expected query_start int32 or int64 of shape \[3\]"),
    ("query_start_list", "expected query_start a tensor"),
    ("query_start_dtype", r"expected query_start int32 or int64 of shape \[3\]"),
    ("max_query_len_tensor", "expected max_query_len a host int"),
    ("max_query_len_negative", "expected max_query_len a host int >= 0"),
    ("max_query_len_zero", "q has 4 rows but there are 2 sequences and max_query_len is 0"),
    ("no_sequences", "q has 4 rows but there are 0 sequences"),
    ("device", "expected every tensor on one device"),
]


@pytest.mark.parametrize(("what", "match"), BAD_PREFILL, ids=[w for w, _ in BAD_PREFILL])
def test_prefill_bad_arguments_raise(what, match):
    x = _batch([(5, 1), (20, 3)], 1, 2, 64, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match=match):
        paged_prefill_triton(**_bad_prefill(x, what))
