"""The C attention of CPU decode rows (kernels/decode_attention.c, `decode_attention_c`) against
its reference, `paged_attention._attend_float32`, on random shapes and caches: contiguous keys
and keys gathered through slots, one row or several of their own lengths; where it serves; and
`paged_decode_torch` taking it."""

from __future__ import annotations

import pytest
import torch

from deepinfer.kernels import decode_attention_c as dc
from deepinfer.kernels import paged_attention as pa
from deepinfer.kernels.int4_gemv import STATE

pytestmark = pytest.mark.skipif(STATE.attention is None, reason=f"C library not loaded: {STATE.why}")


def _case(nkv, g, hd, slots_n, seed):
    gen = torch.Generator().manual_seed(seed)
    k = (torch.randn(slots_n, nkv, hd, generator=gen) * 2).bfloat16()
    v = torch.randn(slots_n, nkv, hd, generator=gen).bfloat16()
    q = (torch.randn(1, nkv, g, hd, generator=gen) * 2).bfloat16()
    return q, k, v


def _close(got, want):
    # the reference's float32 arithmetic, sums in another order: a bfloat16 step at most
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7)
    assert (got != want).float().mean().item() < 0.05


@pytest.mark.parametrize(
    ("nkv", "g", "hd", "L"),
    [(3, 3, 64, 300), (1, 1, 16, 1), (8, 4, 128, 17), (2, 7, 32, 64), (4, 16, 256, 40)],
)
def test_contiguous_keys_match_the_reference(nkv, g, hd, L):
    q, k, v = _case(nkv, g, hd, L + 50, seed=nkv * 100 + L)
    start = 37
    want = pa._attend_float32(q, pa._rows_view(k, start, L), pa._rows_view(v, start, L), None)
    _close(dc.decode_attention(q, k, v, None, start, L), want)


@pytest.mark.parametrize(("hd", "scale"), [(64, 1.0), (64, 40.0), (128, 8.0), (48, 40.0)])
def test_scores_from_flat_to_peaked_match_the_reference(hd, scale):
    """Softmax rows from nearly flat to a few keys far above the rest (scores hundreds apart:
    most exps below the polynomial's floor of -87), through both score paths (head_dim a
    multiple of 32, and 48)."""
    q, k, v = _case(2, 3, hd, 400, seed=int(scale) + hd)
    q = (q.float() * scale).bfloat16()
    L = 333
    want = pa._attend_float32(q, pa._rows_view(k, 0, L), pa._rows_view(v, 0, L), None)
    _close(dc.decode_attention(q, k, v, None, 0, L), want)


@pytest.mark.parametrize(("nkv", "g", "hd", "L"), [(3, 3, 64, 250), (2, 2, 48, 9)])
def test_gathered_keys_match_the_reference(nkv, g, hd, L):
    q, k, v = _case(nkv, g, hd, 512, seed=L)
    slots = torch.randperm(512, generator=torch.Generator().manual_seed(L))[:L]
    gather = lambda c: c[slots].view(1, L, nkv, hd).transpose(1, 2)  # noqa: E731
    want = pa._attend_float32(q, gather(k), gather(v), None)
    _close(dc.decode_attention(q, k, v, slots, 0, L), want)


def test_where_it_serves():
    q, k, v = _case(3, 3, 64, 64, seed=1)
    assert dc.usable(q, k, v, 0.0)
    assert dc.usable(torch.cat([q, q]), k, v, 0.0)  # two rows: the call of several rows
    assert not dc.usable(q, k, v, 50.0)  # soft-cap
    assert not dc.usable(q.float(), k.float(), v.float(), 0.0)
    q72, k72, v72 = _case(3, 3, 72, 64, seed=2)
    assert not dc.usable(q72, k72, v72, 0.0)  # head_dim not a multiple of 16
    q17, k17, v17 = _case(1, 17, 64, 64, seed=3)
    assert not dc.usable(q17, k17, v17, 0.0)  # more than 16 query heads a KV head


ROWS = [(3, 3, 64, (57, 1, 200, 33), 1), (2, 2, 48, (9, 9), 2), (1, 4, 128, (5, 70, 3), 2)]


@pytest.mark.parametrize(("nkv", "g", "hd", "lens", "threads"), ROWS)
def test_rows_match_the_masked_reference_and_each_row_alone(nkv, g, hd, lens, threads):
    """Several rows of their own lengths (keys gathered through a padded slot table, as
    `decode_keys` makes it): within a bfloat16 step of the masked torch reference, and each
    row's output bit for bit the single-row call's, over one thread or two."""
    q, k, v = _case(nkv, g, hd, 512, seed=sum(lens))
    R, L = len(lens), max(lens)
    q = (torch.randn(R, nkv, g, hd, generator=torch.Generator().manual_seed(R)) * 2).bfloat16()
    perm = torch.randperm(512, generator=torch.Generator().manual_seed(L))
    slots = torch.stack([torch.cat([perm[r * 100 : r * 100 + n], perm[r * 100 + n - 1].repeat(L - n)])
                         for r, n in enumerate(lens)])  # fmt: skip
    n = torch.tensor(lens)
    mask = (torch.arange(L) < n[:, None])[:, None, None, :]
    gather = lambda c: c.index_select(0, slots.view(-1)).view(R, L, nkv, hd).transpose(1, 2)  # noqa: E731
    want = pa._attend_float32(q, gather(k), gather(v), mask)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = dc.decode_attention_rows(q, k, v, slots, n)
    finally:
        torch.set_num_threads(before)
    _close(got, want)
    for r, m in enumerate(lens):
        alone = dc.decode_attention(q[r : r + 1].contiguous(), k, v, slots[r, :m], 0, m)
        assert torch.equal(got[r : r + 1], alone)


def test_paged_decode_takes_the_c_call_at_one_row(monkeypatch):
    """`paged_decode_torch` at one bfloat16 row: the C call's result, within a bfloat16 step of
    the torch ops it replaces (the library unloaded), for keys side by side and gathered."""
    q, k, v = _case(3, 3, 64, 256, seed=4)
    tables = torch.tensor([[3, 0, 1, 7]], dtype=torch.int32)  # blocks of 16: not side by side
    for table in (tables, torch.tensor([[2, 3, 4, 5]], dtype=torch.int32)):
        keys = pa.decode_keys(table, [57], 16)
        got = pa.paged_decode_torch(q, k, v, keys)
        with monkeypatch.context() as m:
            m.setattr(STATE, "attention", None)
            want = pa.paged_decode_torch(q, k, v, keys)
        _close(got, want)
        slots = keys.slots.view(-1)
        assert torch.equal(got, dc.decode_attention(q, k, v, None if keys.start is not None else slots,
                                                    keys.start or 0, slots.numel()))  # fmt: skip


def test_paged_decode_takes_the_c_call_at_several_rows(monkeypatch):
    """`paged_decode_torch` at three bfloat16 rows of their own lengths: the call of several rows,
    within a bfloat16 step of the torch ops (gather, padding mask, SDPA) it replaces."""
    _, k, v = _case(3, 3, 64, 256, seed=5)
    q = (torch.randn(3, 3, 3, 64, generator=torch.Generator().manual_seed(5)) * 2).bfloat16()
    tables = torch.tensor([[3, 0, 1, 7], [2, 4, 5, 6], [9, 10, 11, 12]], dtype=torch.int32)
    keys = pa.decode_keys(tables, [57, 12, 33], 16)
    assert keys.mask is not None and keys.lens.tolist() == [57, 12, 33]
    got = pa.paged_decode_torch(q, k, v, keys)
    with monkeypatch.context() as m:
        m.setattr(STATE, "attention_rows", None)
        want = pa.paged_decode_torch(q, k, v, keys)
    _close(got, want)
    assert torch.equal(got, dc.decode_attention_rows(q, k, v, keys.slots, keys.lens))
