"""The C RoPE + K/V store of a CPU decode step (kernels/rope_store_c.py, rope_store.c) against
`fused.rope_store_torch` (the same bits: every product and sum rounded as torch rounds them), on
random tokens at SmolLM2's and Llama's head shapes, q|k|v as the fused projection lays them out;
the layer ops' choice of it; and a slot outside the cache refused before anything is written."""

from __future__ import annotations

import pytest
import torch

from deepinfer.kernels import rope_store_c as cr
from deepinfer.kernels.fused import rope_store_reference, rope_store_torch, signed_sin
from deepinfer.models.layers import ops, rope_tables
from tests.kernels._util import c_library


@pytest.fixture(scope="module", autouse=True)
def kernel(tmp_path_factory):
    c_library(tmp_path_factory)


def _inputs(N: int, nh: int, nkv: int, hd: int, seed: int):
    """q|k|v rows [N, nh + 2 nkv, hd] (bfloat16, of a residual stream's range), the tokens'
    cos and signed sin rows [N, 1, hd] at random positions, empty caches of 16 slots and the
    tokens' distinct slots."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(N, nh + 2 * nkv, hd, generator=g) * 8).bfloat16()
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    cos, sin = rope_tables(inv, 4096, "cpu", torch.bfloat16)
    positions = torch.randint(0, 4096, (N,), generator=g)
    rows = (cos[positions, None], signed_sin(sin)[positions, None])
    k_flat, v_flat = (torch.zeros(16, nkv, hd, dtype=torch.bfloat16) for _ in range(2))
    slots = torch.randperm(16, generator=g)[:N]
    return qkv, rows, (cos, sin, positions), k_flat, v_flat, slots


@pytest.mark.parametrize("N,nh,nkv,hd", [(1, 9, 3, 64), (1, 32, 8, 128), (3, 4, 1, 16), (4, 2, 2, 256)])
def test_rope_store_equals_the_torch_path_bit_for_bit(N, nh, nkv, hd):
    qkv, (c, s), (cos, sin, positions), k_flat, v_flat, slots = _inputs(N, nh, nkv, hd, N * nh + hd)
    qk, v = qkv[:, : nh + nkv], qkv[:, nh + nkv :]
    k_ref, v_ref = k_flat.clone(), v_flat.clone()
    q_ref = rope_store_torch(qk, v, c, s, None, k_ref, v_ref, slots, nh)
    assert cr.usable(qk, v, c, s, None, k_flat, v_flat, slots, nh)
    q = cr.rope_store(qk, v, c, s, k_flat, v_flat, slots, nh)
    assert torch.equal(q, q_ref) and torch.equal(k_flat, k_ref) and torch.equal(v_flat, v_ref)
    assert bool(v_flat[slots].ne(0).any())  # (written: the rows are random)
    # and the reference of both (its own rotate_half): within a bfloat16 step
    k_def, v_def = torch.zeros_like(k_flat), torch.zeros_like(v_flat)
    q_def = rope_store_reference(qk, v, cos, sin, positions, k_def, v_def, slots, nh)
    assert torch.allclose(q.float(), q_def.float(), rtol=2**-7, atol=1e-2)
    assert torch.equal(v_flat, v_def)


def test_layer_ops_take_it_for_a_decode_step_only():
    nh, nkv, hd = 9, 3, 64
    qkv, (c, s), (cos, sin, positions), k_flat, v_flat, slots = _inputs(2, nh, nkv, hd, 7)
    qk, v = qkv[:, : nh + nkv], qkv[:, nh + nkv :]
    op = ops(False, 1e-5, quantized=True)
    k_ref, v_ref = k_flat.clone(), v_flat.clone()
    assert torch.equal(
        op.rope_store(qk, v, c, s, None, k_flat, v_flat, slots, nh),
        rope_store_torch(qk, v, c, s, None, k_ref, v_ref, slots, nh),
    )
    assert torch.equal(k_flat, k_ref)
    many = torch.cat([qkv] * 3)  # more tokens than a decode step's: torch's ops
    big = (many[:, : nh + nkv], many[:, nh + nkv :], torch.cat([c] * 3), torch.cat([s] * 3))
    assert not cr.usable(*big, None, k_flat, v_flat, torch.arange(6), nh)
    assert not cr.usable(qk.float(), v.float(), c.float(), s.float(), None, k_flat, v_flat, slots, nh)
    assert not cr.usable(qk, v, cos, sin, positions, k_flat, v_flat, slots, nh)  # (tables: torch's)


def test_a_slot_outside_the_cache_is_refused_before_anything_is_written():
    nh, nkv, hd = 4, 2, 32
    qkv, (c, s), _, k_flat, v_flat, _ = _inputs(2, nh, nkv, hd, 3)
    qk, v = qkv[:, : nh + nkv], qkv[:, nh + nkv :]
    for bad in ([3, 16], [-1, 2]):
        slots = torch.tensor(bad)
        with pytest.raises(IndexError, match="outside the cache's 16"):
            cr.rope_store(qk, v, c, s, k_flat, v_flat, slots, nh)
        assert not k_flat.any() and not v_flat.any()
