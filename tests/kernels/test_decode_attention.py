"""Batch-invariant decode attention over gathered keys (kernels/decode_attention.py) against a
float64 per-row reference, and a row's bits alone vs inside a batch (the CUDA rows are marked
gpu). The paged kernels are tested in test_paged_attention.py."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deepinfer.kernels.decode_attention import (  # noqa: E402
    ATTN_CHUNK,
    decode_attention_torch,
)

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]
SHAPES = [(2, 1, 16), (2, 3, 64), (1, 4, 128), (3, 2, 48)]  # (kv heads, query heads per kv head, head_dim)


def _run(impl, q, kc, vc, positions, slot_start, kv_len):
    B = q.shape[0]
    keys, values = kc[slot_start : slot_start + B, :, :kv_len], vc[slot_start : slot_start + B, :, :kv_len]
    visible = torch.arange(kv_len, device=q.device) <= positions.unsqueeze(1)
    return decode_attention_torch(q, keys, values, visible)


def _reference(q, kc, vc, positions, slot_start):
    """The docstring's loop, in float64."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for b, p in enumerate(positions.tolist()):
        k = kc[slot_start + b, :, : p + 1].double().cpu()  # [nkv, n, hd]
        v = vc[slot_start + b, :, : p + 1].double().cpu()
        s = q[b].double().cpu() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # [nkv, g, n]
        out[b] = torch.softmax(s, dim=-1) @ v
    return out


def _inputs(nkv, g, hd, dtype, device, B=3, S=7, L=2 * ATTN_CHUNK, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nkv, g, hd, generator=gen)
    kc = torch.randn(S, nkv, L, hd, generator=gen)
    vc = torch.randn(S, nkv, L, hd, generator=gen)
    return [t.to(device, dtype) for t in (q, kc, vc)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", ["torch"])
@pytest.mark.parametrize(("nkv", "g", "hd"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(device, impl, nkv, g, hd, dtype):
    q, kc, vc = _inputs(nkv, g, hd, dtype, device)
    positions = torch.tensor([0, 37, 300], device=device)  # one key; past a Triton block; past a chunk
    got = _run(impl, q, kc, vc, positions, 2, 2 * ATTN_CHUNK)
    assert got.shape == q.shape and got.dtype == dtype
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double().cpu(), _reference(q, kc, vc, positions, 2), atol=tol, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", ["torch"])
def test_row_bits_do_not_depend_on_the_batch(device, impl):
    """Row 1 of a batch == the same row at another index, beside other rows and lengths, and
    (for the torch version, in its fixed-shape use) with kv_len 256 vs 512."""
    nkv, g, hd = 2, 3, 64
    q, kc, vc = _inputs(nkv, g, hd, torch.bfloat16, device, B=4)
    pos = torch.tensor([300, 40, 7, 150], device=device)
    a = _run(impl, q, kc, vc, pos, 2, 2 * ATTN_CHUNK)  # row 1 = slot 3
    # the same row (slot 3, position 40) at index 3 of another batch with other neighbours
    q2, kc2, vc2 = _inputs(nkv, g, hd, torch.bfloat16, device, B=4, seed=1)
    q2[3], kc2[3], vc2[3] = q[1], kc[3], vc[3]
    pos2 = torch.tensor([5, 200, 90, 40], device=device)
    b = _run(impl, q2, kc2, vc2, pos2, 0, ATTN_CHUNK)  # kv_len 256 (every row fits)
    assert torch.equal(a[1], b[3])
    if impl == "triton":  # no fixed tile needed: alone, as a batch of one
        c = _run(impl, q[1:2], kc, vc, pos[1:2], 3, ATTN_CHUNK)
        assert torch.equal(a[1], c[0])
