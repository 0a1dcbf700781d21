"""Batch-invariant decode attention (kernels/decode_attention.py): both implementations against a
float64 per-row reference, and a row's bits alone vs inside a batch.

TRITON_INTERPRET=1 must be set before the Triton kernel is imported so that it runs on CPU; on a
GPU machine run with TRITON_INTERPRET=0 (the CUDA rows are marked gpu)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deepinfer.kernels.decode_attention import (  # noqa: E402
    ATTN_CHUNK,
    decode_attention_torch,
    decode_attention_triton,
)

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]
SHAPES = [(2, 1, 16), (2, 3, 64), (1, 4, 128), (3, 2, 48)]  # (kv heads, query heads per kv head, head_dim)


def _run(impl, q, kc, vc, positions, slot_start, kv_len):
    if impl == "triton":
        if (q.device.type == "cpu") != INTERPRET:
            pytest.skip("Triton runs on CPU only under TRITON_INTERPRET=1, on CUDA only without it")
        return decode_attention_triton(q, kc, vc, positions, slot_start)
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
@pytest.mark.parametrize("impl", ["torch", "triton"])
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
@pytest.mark.parametrize("impl", ["torch", "triton"])
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


def test_triton_rejects_slots_past_the_cache():
    q, kc, vc = _inputs(1, 1, 16, torch.float32, "cpu", B=3, S=4)
    with pytest.raises(ValueError, match="exceed the cache"):
        decode_attention_triton(q, kc, vc, torch.zeros(3, dtype=torch.int64), 2)


@pytest.mark.parametrize("device", DEVICES)
def test_triton_rows_with_their_own_slots(device):
    """slots=[...]: row b reads slots[b] (a prefill's rows: one per token, several rows per
    slot at increasing positions), the same bits as that row read through slot_start."""
    if (device == "cpu") != INTERPRET:
        pytest.skip("Triton runs on CPU only under TRITON_INTERPRET=1, on CUDA only without it")
    q, kc, vc = _inputs(2, 3, 64, torch.bfloat16, device, B=5)
    slots = torch.tensor([4, 4, 4, 1, 6], device=device)
    pos = torch.tensor([0, 1, 70, 33, 300], device=device)
    got = decode_attention_triton(q, kc, vc, pos, slots=slots)
    for b, s in enumerate(slots.tolist()):
        one = decode_attention_triton(q[b : b + 1], kc, vc, pos[b : b + 1], s)
        assert torch.equal(got[b], one[0])


def test_rows_matches_reference_and_skips_padding():
    """The CPU's per-row attention: each decoded row against the float64 loop (its own keys
    only); a padding row (length None) gives zeros."""
    q, kc, vc = _inputs(2, 3, 64, torch.float32, "cpu", B=3)
    positions = torch.tensor([0, 37, 300])
    from deepinfer.kernels.decode_attention import decode_attention_rows

    got = decode_attention_rows(q, kc, vc, [1, None, 301], 2)
    want = _reference(q, kc, vc, positions, 2)
    torch.testing.assert_close(got[[0, 2]].double(), want[[0, 2]], atol=2e-5, rtol=0)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
