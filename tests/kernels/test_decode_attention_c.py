"""The C attention of a CPU decode row (kernels/decode_attention.c, `decode_attention_c`) against
its reference, `paged_attention._attend_float32`, on random shapes and caches: contiguous keys
and keys gathered through slots; where it serves; and `paged_decode_torch` taking it."""

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
    assert dc.usable(q, k, v, None, 0.0)
    assert not dc.usable(torch.cat([q, q]), k, v, None, 0.0)  # two rows: torch's batched call
    assert not dc.usable(q, k, v, torch.ones(1, 1, 1, 64, dtype=torch.bool), 0.0)  # padding mask
    assert not dc.usable(q, k, v, None, 50.0)  # soft-cap
    assert not dc.usable(q.float(), k.float(), v.float(), None, 0.0)
    q72, k72, v72 = _case(3, 3, 72, 64, seed=2)
    assert not dc.usable(q72, k72, v72, None, 0.0)  # head_dim not a multiple of 16
    q17, k17, v17 = _case(1, 17, 64, 64, seed=3)
    assert not dc.usable(q17, k17, v17, None, 0.0)  # more than 16 query heads a KV head


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
