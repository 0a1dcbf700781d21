"""The batch- and tiling-invariant paged attention (`paged_invariant_triton`, kernels/paged_attention.py):
against the float64 reference (NaN in every slot no tile reads); a token's bits the same in one
prompt chunk, in chunks of other sizes, as a decode row and beside other sequences in another
order, with and without a sliding window or a soft-cap; its argument checks. Then the model: the
deterministic forward's logits at every position the same bits in one chunk, in chunks, and as
decode steps (decode_static).

TRITON_INTERPRET=1 must be set before the kernel is imported so that it runs on CPU; on a GPU
machine run with TRITON_INTERPRET=0 (the CUDA rows, marked gpu, are what prove the bits on tensor
cores)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deepinfer.kernels.paged_attention import (  # noqa: E402
    paged_attention_reference,
    paged_invariant_triton,
)
from tests.kernels._util import TRITON_DEVICES  # noqa: E402
from tests.kernels.test_paged_attention import Batch, _batch  # noqa: E402

DEVICES = TRITON_DEVICES
# (kv heads, query heads per kv head, head_dim, block_size, dtype): a tile of one head per row
# (g = 1), GQA with a head_dim to pad, g = 8 at 128; blocks of 16 and 4 positions
REFERENCE = [
    (2, 1, 64, 16, torch.bfloat16),
    (1, 4, 80, 4, torch.bfloat16),
    (2, 8, 128, 16, torch.bfloat16),
    (1, 4, 80, 16, torch.float32),
]
VARIANTS = [  # (window, softcap)
    pytest.param(20, 0.0, id="window"),
    pytest.param(0, 5.0, id="softcap"),
]


def _tile_rows(g: int, hd: int, dtype: torch.dtype) -> int:
    from deepinfer.kernels.paged_invariant_triton import config

    return config(g, hd, dtype == torch.float32)[0]


def _call(x: Batch, positions: torch.Tensor | None = None, *, max_query_len=None, window=0, softcap=0.0):
    """paged_invariant_triton on a batch (its rows at their positions unless given);
    max_query_len defaults to 5 more than needed (programs past every sequence's rows)."""
    if max_query_len is None:
        max_query_len = max(b - a for a, b in zip(x.query_start, x.query_start[1:])) + 5
    qs = torch.tensor(x.query_start, device=x.q.device)
    pos = x.rows[1].long() if positions is None else positions  # (an empty list gives float32)
    return paged_invariant_triton(x.q, x.k_cache, x.v_cache, x.block_tables, qs, pos, max_query_len,
                                  window=window, softcap=softcap)  # fmt: skip


def _specs(g: int, hd: int, dtype: torch.dtype) -> list[tuple[int, int]]:
    """(seq_len, query rows): 37 new tokens after 15 cached, a sequence without rows, BLOCK_M + 21
    new tokens after 70 cached (several tiles, past a key block), a decode row after 69 keys, a
    whole prefill of 40."""
    T = _tile_rows(g, hd, dtype) + 21
    return [(52, 37), (23, 0), (70 + T, T), (70, 1), (40, 40)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("nkv", "g", "hd", "bs", "dtype"), REFERENCE)
def test_matches_reference(device, nkv, g, hd, bs, dtype):
    """Prefill chunks, a decode row and a sequence without rows in one call, NaN in every slot
    no tile reads (the null block, past each sequence's length)."""
    x = _batch(_specs(g, hd, dtype), nkv, g, hd, bs, dtype, device)
    got = _call(x)
    assert got.shape == x.q.shape and got.dtype == dtype and got.is_contiguous()
    assert not got.isnan().any()
    want = paged_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("window", "softcap"), VARIANTS)
def test_window_and_softcap_match_reference(device, window, softcap):
    x = _batch(_specs(4, 64, torch.bfloat16), 2, 4, 64, 16, torch.bfloat16, device)
    got = _call(x, window=window, softcap=softcap)
    assert not got.isnan().any()
    want = paged_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows, window=window,
                                     softcap=softcap)  # fmt: skip
    torch.testing.assert_close(got.double().cpu(), want, atol=3e-2, rtol=0)


def _split(x: Batch, target: int, pieces: list[tuple[int, int]], others: list[int]):
    """A batch of x's data: rows [a, b) of sequence ``target`` for each piece (a sequence of its
    own, through the same table row), with sequences ``others`` (whole) around them, in the order
    others[0], the pieces, others[1:]. -> (the batch, its positions, where the pieces' rows went)."""
    qs = x.query_start
    s = qs[target]
    parts = [(b, qs[b], qs[b + 1]) for b in others[:1]]
    parts += [(target, s + a, s + e) for a, e in pieces]
    parts += [(b, qs[b], qs[b + 1]) for b in others[1:]]
    rows, starts, at = [], [0], []
    for i, (_, lo, hi) in enumerate(parts):
        if i >= len(others[:1]) and i < len(others[:1]) + len(pieces):
            at += range(len(rows), len(rows) + hi - lo)
        rows += range(lo, hi)
        starts.append(len(rows))
    positions = x.rows[1]
    table = x.block_tables[[b for b, _, _ in parts]]
    idx = torch.tensor(rows, device=x.q.device)
    y = Batch(x.q[idx], x.k_cache, x.v_cache, table, starts, [0] * len(parts))
    return y, positions[idx], at


def _cut(bounds: list[int]) -> list[tuple[int, int]]:
    return list(zip(bounds, bounds[1:]))


CHUNKINGS = [
    pytest.param(torch.float32, 0, 0.0, id="causal-float32"),
    pytest.param(torch.bfloat16, 0, 0.0, id="causal-bfloat16"),
    pytest.param(torch.bfloat16, 20, 0.0, id="window-bfloat16"),
    pytest.param(torch.bfloat16, 0, 5.0, id="softcap-bfloat16"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "window", "softcap"), CHUNKINGS)
def test_row_bits_do_not_depend_on_chunks_batch_or_decode(device, dtype, window, softcap):
    """Sequence 1 (100 new tokens after 6 cached: query tiles and key blocks that straddle each
    other) prefilled in one chunk beside three other sequences == in chunks 13 / 1 / 36 / 27 / 23
    == in other chunks beside the other sequences in another order == as decode rows (one row a
    sequence; rows at tile and key-block edges) == the chunks as separate calls; torch.equal."""
    x = _batch([(37, 1), (106, 100), (5, 1), (90, 3)], 1, 4, 16, 8, dtype, device)
    kw = dict(window=window, softcap=softcap)
    one = _call(x, **kw)
    s, e = x.query_start[1], x.query_start[2]
    want = one[s:e]
    decode = [0, 3, 4, 15, 16, 17, 57, 58, 59, 99]
    cuts = [
        (_cut([0, 13, 14, 50, 77, 100]), [0]),
        (_cut([0, 3, 40, 41, 42, 100]), [3, 0, 2]),
        ([(t, t + 1) for t in decode], [2, 0]),
    ]
    for pieces, others in cuts:
        y, pos, at = _split(x, 1, pieces, others)
        got = _call(y, pos, **kw)
        rows = [t for a, b in pieces for t in range(a, b)]
        assert torch.equal(got[at], want[rows]), pieces[:5]
    for a, b in [(0, 13), (13, 14), (14, 100)]:  # separate calls, the chunk alone
        y, pos, _ = _split(x, 1, [(a, b)], [])
        assert torch.equal(_call(y, pos, max_query_len=b - a, **kw), want[a:b])


@pytest.mark.parametrize("device", DEVICES)
def test_long_prompt_tiles_give_decode_rows_bits(device):
    """A 300-row prompt at head_dim 128 (a call of long sequences: the tall tile of `config` on
    CUDA) == its rows at tile and key-block edges as decode rows == its last rows as a short chunk
    (the decode tile); torch.equal."""
    from deepinfer.kernels.paged_invariant_triton import LONG_ROWS

    x = _batch([(300, 300)], 2, 4, 128, 16, torch.bfloat16, device)
    assert 300 >= LONG_ROWS
    want = _call(x)
    decode = [0, 1, 15, 16, 63, 64, 65, 127, 128, 255, 256, 298, 299]
    for pieces in ([(t, t + 1) for t in decode], [(297, 300)]):
        y, pos, at = _split(x, 0, pieces, [])
        got = _call(y, pos, max_query_len=max(b - a for a, b in pieces))
        rows = [t for a, b in pieces for t in range(a, b)]
        assert torch.equal(got[at], want[rows]), pieces[:3]


@pytest.mark.parametrize("device", DEVICES)
def test_rows_past_a_row_do_not_change_it(device):
    """As in a verify forward's tile: rows 0..39 of a sequence alone == followed in their tiles by
    rows 40..59 == the same with 1e4 in keys and values 40..59 (keys rows 0..39 do not see)."""
    x = _batch([(60, 60)], 1, 4, 64, 16, torch.bfloat16, device)
    alone, pos, _ = _split(x, 0, [(0, 40)], [])
    a = _call(alone, pos, max_query_len=40)
    assert torch.equal(_call(x)[:40], a)
    k, v = x.k_cache.clone(), x.v_cache.clone()
    for p in range(40, 60):
        blk = int(x.block_tables[0, p // 16])
        k[blk, p % 16] = 1e4
        v[blk, p % 16] = -1e4
    assert torch.equal(_call(Batch(x.q, k, v, x.block_tables, x.query_start, x.seq_lens))[:40], a)


@pytest.mark.parametrize("device", DEVICES)
def test_bits_do_not_depend_on_garbage_index_dtypes_or_grid(device):
    """NaN, 1e4 or zeros in the unread slots, int32 or int64 tables and offsets, max_query_len
    exact or larger, q contiguous or a strided view (as the model slices it from q|k|v): the
    same bits."""
    specs = _specs(4, 64, torch.bfloat16)
    x = _batch(specs, 1, 4, 64, 16, torch.bfloat16, device)
    a = _call(x)
    for garbage in (1e4, 0.0):
        assert torch.equal(_call(_batch(specs, 1, 4, 64, 16, torch.bfloat16, device, garbage=garbage)), a)
    dev = x.q.device
    qs32 = torch.tensor(x.query_start, dtype=torch.int32, device=dev)
    got = paged_invariant_triton(x.q, x.k_cache, x.v_cache, x.block_tables.long(), qs32, x.rows[1].int(),
                                 max(T for _, T in specs))  # fmt: skip
    assert torch.equal(got, a)
    qkv = torch.cat([x.q.flatten(1), torch.zeros_like(x.q.flatten(1))], dim=1)
    strided = qkv[:, : 4 * 64].view(x.q.shape)
    assert not strided.is_contiguous()
    y = Batch(strided, x.k_cache, x.v_cache, x.block_tables, x.query_start, x.seq_lens)
    assert torch.equal(_call(y), a)


@pytest.mark.parametrize("device", DEVICES)
def test_without_rows(device):
    """No rows at all (N = 0), and sequences that all have 0 rows: an empty result."""
    x = _batch([(5, 0), (20, 0)], 1, 2, 64, 16, torch.float32, device)
    assert _call(x, max_query_len=0).shape == (0, 1, 2, 64)
    assert _call(x, max_query_len=3).shape == (0, 1, 2, 64)


def _bad(x: Batch, what: str) -> dict:
    """The kwargs of a paged_invariant_triton call with one bad argument."""
    qs = torch.tensor(x.query_start)
    pos = x.rows[1]
    args = dict(q=x.q, k_cache=x.k_cache, v_cache=x.v_cache, block_tables=x.block_tables, query_start=qs,
                positions=pos, max_query_len=3)  # fmt: skip
    changes = {
        "q_3d": dict(q=x.q[0]),
        "cache_dtype": dict(k_cache=x.k_cache.double(), v_cache=x.v_cache.double()),
        "q_int": dict(q=x.q.int(), k_cache=x.k_cache.int(), v_cache=x.v_cache.int()),
        "block_size": dict(k_cache=x.k_cache[:, :3], v_cache=x.v_cache[:, :3]),
        "table_rows": dict(block_tables=x.block_tables[:1]),
        "query_start_list": dict(query_start=x.query_start),
        "query_start_2d": dict(query_start=qs[None]),
        "positions_len": dict(positions=pos[:-1]),
        "positions_dtype": dict(positions=pos.float()),
        "max_query_len_tensor": dict(max_query_len=torch.tensor(3)),
        "max_query_len_zero": dict(max_query_len=0),
        "window": dict(window=-1),
        "device": dict(positions=pos.to("meta")),
    }
    return {**args, **changes[what]}


BAD = [
    ("q_3d", r"expected q of shape \[N, nkv, g, hd\]"),
    ("cache_dtype", "expected k_cache and v_cache in q's dtype"),
    ("q_int", "expected q float32, bfloat16 or float16"),
    ("block_size", "expected block_size .* a power of two, got 3"),
    ("table_rows", r"expected a block_tables row per sequence \(2\), got 1"),
    ("query_start_list", "expected query_start a tensor"),
    ("query_start_2d", r"expected query_start int32 or int64 of shape \[B \+ 1\]"),
    ("positions_len", r"expected positions int64 \(or int32\) of shape \[4\]"),
    ("positions_dtype", r"expected positions int64 \(or int32\) of shape \[4\]"),
    ("max_query_len_tensor", "expected max_query_len a host int"),
    ("max_query_len_zero", "q has 4 rows but there are 2 sequences and max_query_len is 0"),
    ("window", "expected window a host int >= 0"),
    ("device", "expected every tensor on one device"),
]


@pytest.mark.parametrize(("what", "match"), BAD, ids=[w for w, _ in BAD])
def test_bad_arguments_raise(what, match):
    x = _batch([(5, 1), (20, 3)], 1, 2, 64, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match=match):
        paged_invariant_triton(**_bad(x, what))


# ---------------------------------------------------------------- the model


@pytest.mark.parametrize("device", DEVICES)
def test_model_prefill_chunks_equal_decode_steps(device):
    """The deterministic forward (invariant=True) of a 24-token sequence: every position's logits
    in one chunk == in chunks 7 / 1 / 9 / 7 == as decode steps (decode_static, invariant) after
    a 16-token prefill, the cache then written by decode; and at positions 9 and 23 of the
    one-chunk cache as row 2 of 3; torch.equal. bfloat16 on CUDA, float32 on the CPU (the
    interpreter computes in float32)."""
    from deepinfer.models.llama import ForwardBatch
    from tests.kernels.test_invariant import _small_model

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = _small_model(device, dtype)
    bs, L = 8, 24
    tokens = [(7 * i + 3) % 384 for i in range(L)]
    table = [3, 1, 2]  # shuffled block ids

    def to(v):
        return torch.tensor(v, dtype=torch.int64, device=device)

    def prefill(bounds):
        cache = model.new_cache(4, bs)
        out = []
        for a, b in zip(bounds, bounds[1:]):
            batch = ForwardBatch.of_chunks(to, [table], [a], [tokens[a:b]], bs, logits="all")
            out.append(model.forward(batch, cache, invariant=True))
        return torch.cat(out), cache

    def decode(cache, p, rows=1, at=0):
        tables = torch.zeros(rows, len(table), dtype=torch.int32, device=device)
        tables[at] = to(table)
        pos, tok, slots = to([0] * rows), to([0] * rows), to([0] * rows)  # others: padding (null block)
        pos[at], tok[at], slots[at] = p, tokens[p], table[p // bs] * bs + p % bs
        kw = dict(kv_len=bs * len(table), attention="triton", invariant=True)
        return model.decode_static(tok, pos, slots, tables, cache, **kw)[at]

    one, cache = prefill([0, L])
    assert torch.equal(prefill([0, 7, 8, 17, L])[0], one)
    for p in (9, 23):
        assert torch.equal(decode(cache, p, rows=3, at=2), one[p]), p
    _, cache = prefill([0, 16])
    for p in range(16, L):
        assert torch.equal(decode(cache, p), one[p]), p
