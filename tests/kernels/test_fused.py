"""The fused layer kernels (kernels/fused.py) against their torch references on random inputs:
add + RMSNorm, RoPE + KV-cache store, and the GLU; a row's bits the same alone and in a batch.

TRITON_INTERPRET=1 must be set before the kernels are imported so that they run on CPU; on a GPU
run with TRITON_INTERPRET=0 (the CUDA rows are marked gpu)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deepinfer.kernels import fused as fk  # noqa: E402
from deepinfer.models.layers import rope_inv_freq, rope_tables  # noqa: E402
from tests.kernels._util import TRITON_DEVICES  # noqa: E402

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEVICES = TRITON_DEVICES
DTYPES = [torch.float32, torch.bfloat16]


def _exact(device: str, dtype: torch.dtype) -> bool:
    """Whether an elementwise chain rounds exactly as torch's ops: in float32 under the
    interpreter. (The interpreter casts float32 to bfloat16 by truncating; on the GPU the compiler
    may narrow a product to 16 bits and contract it with the sum into one fused multiply-add.)"""
    return device == "cpu" and dtype == torch.float32


def _rand(*shape, dtype, device, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H", [64, 100, 4096])
def test_add_rms_norm_matches_reference(device, dtype, H):
    x = _rand(7, H, dtype=dtype, device=device, seed=0, scale=3.0)
    d = _rand(7, H, dtype=dtype, device=device, seed=1)
    w = _rand(H, dtype=dtype, device=device, seed=2).abs() + 0.5
    s, y = fk.add_rms_norm(x, d, w, 1e-6)
    s_ref, y_ref = fk.add_rms_norm_reference(x, d, w, 1e-6)
    assert s.dtype == y.dtype == dtype and s.shape == y.shape == (7, H)
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2  # (bf16: an ulp, where the float32 sums round apart)
    if device == "cuda" or dtype == torch.float32:
        assert torch.equal(s, s_ref)  # one rounding of an exact float32 sum: torch's bits
    torch.testing.assert_close(s, s_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
    s0, y0 = fk.add_rms_norm(x, None, w, 1e-6)  # no residual: the norm of x
    assert s0 is x
    torch.testing.assert_close(y0, fk.add_rms_norm_reference(x, None, w, 1e-6)[1], rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_add_rms_norm_row_alone_equals_row_in_batch(device):
    x = _rand(100, 576, dtype=torch.bfloat16, device=device, seed=3)
    d = _rand(100, 576, dtype=torch.bfloat16, device=device, seed=4)
    w = _rand(576, dtype=torch.bfloat16, device=device, seed=5)
    s, y = fk.add_rms_norm(x, d, w, 1e-5)
    for r in (0, 37, 99):
        s1, y1 = fk.add_rms_norm(x[r : r + 1], d[r : r + 1], w, 1e-5)
        assert torch.equal(s1[0], s[r]) and torch.equal(y1[0], y[r])


@pytest.mark.parametrize("device", DEVICES)
def test_add_rms_norm_equals_invariant_norm_of_the_sum(device):
    """Deterministic mode's norm: the fused kernel gives the bits of the batch-invariant RMSNorm
    of the rounded sum (same one-block row reduction)."""
    from deepinfer.kernels import invariant as bi

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = _rand(5, 576, dtype=dtype, device=device, seed=6, scale=2.0)
    d = _rand(5, 576, dtype=dtype, device=device, seed=7)
    w = _rand(576, dtype=dtype, device=device, seed=8)
    s, y = fk.add_rms_norm(x, d, w, 1e-5)
    assert torch.equal(y, bi.rms_norm(x + d, w, 1e-5))


def _rope_case(N, nh, nkv, hd, dtype, device, seed, positions):
    from deepinfer.config import ModelConfig

    cfg = ModelConfig(vocab_size=8, hidden_size=nh * hd, intermediate_size=8, num_layers=1, num_heads=nh,
                      num_kv_heads=nkv, head_dim=hd, rope_theta=1e4, max_position_embeddings=512)  # fmt: skip
    cos, sin = rope_tables(rope_inv_freq(cfg), 512, device, dtype)
    qkv = _rand(N, nh + 2 * nkv, hd, dtype=dtype, device=device, seed=seed)
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(seed))[:N].to(device)
    pos = torch.tensor(positions, device=device)
    return qkv, cos, sin, pos, slots


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("nh", "nkv", "hd"), [(4, 2, 16), (9, 3, 64), (32, 8, 128), (3, 1, 24)])
def test_rope_store_equals_reference(device, dtype, nh, nkv, hd):
    N = 5
    qkv, cos, sin, pos, slots = _rope_case(N, nh, nkv, hd, dtype, device, 0, [0, 1, 17, 300, 511])
    qk, v = qkv[:, : nh + nkv], qkv[:, nh + nkv :]  # views of the fused projection, as the model has them
    caches = [torch.full((64, nkv, hd), float("nan"), dtype=dtype, device=device) for _ in range(4)]
    q = fk.rope_store(qk, v, cos, sin, pos, caches[0], caches[1], slots, nh)
    q_ref = fk.rope_store_reference(qk, v, cos, sin, pos, caches[2], caches[3], slots, nh)
    assert q.shape == (N, nh, hd) and q.is_contiguous()
    if _exact(device, dtype):
        assert torch.equal(q, q_ref)  # each product and the sum rounded as torch's ops round them
    tol = 1e-6 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(q, q_ref, rtol=tol, atol=tol)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        if _exact(device, dtype):
            assert torch.equal(got[slots], want[slots])
        torch.testing.assert_close(got[slots], want[slots], rtol=tol, atol=tol)
        untouched = torch.ones(64, dtype=torch.bool, device=device)
        untouched[slots] = False
        assert got[untouched].isnan().all()
    assert torch.equal(caches[1][slots], v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("nh", "nkv", "hd"), [(4, 2, 16), (9, 3, 64), (3, 1, 24)])
@pytest.mark.parametrize("gathered", [True, False])
def test_rope_store_torch_is_the_references_bits(dtype, nh, nkv, hd, gathered):
    """The CPU path (a signed sin table, roll instead of negate-and-join): the reference's bits,
    for the tokens' rows gathered beforehand (the model's way) or the tables and positions."""
    N = 5
    qkv, cos, sin, pos, slots = _rope_case(N, nh, nkv, hd, dtype, "cpu", 1, [0, 3, 17, 300, 511])
    qk, v = qkv[:, : nh + nkv], qkv[:, nh + nkv :]
    caches = [torch.full((64, nkv, hd), float("nan"), dtype=dtype) for _ in range(4)]
    signed = fk.signed_sin(sin)
    if gathered:
        q = fk.rope_store_torch(qk, v, cos[pos], signed[pos], None, caches[0], caches[1], slots, nh)
        # the model's rows: [N, 1, hd], shaped once a step to broadcast over the heads
        assert torch.equal(
            fk.rope_store_torch(qk, v, cos[pos, None], signed[pos, None], None, *caches[2:], slots, nh), q
        )
    else:
        q = fk.rope_store_torch(qk, v, cos, signed, pos, caches[0], caches[1], slots, nh)
    q_ref = fk.rope_store_reference(qk, v, cos, sin, pos, caches[2], caches[3], slots, nh)
    assert torch.equal(q, q_ref)
    assert torch.equal(caches[0][slots], caches[2][slots]) and torch.equal(caches[1][slots], v)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_store_rejects_bad_shapes(device):
    qkv, cos, sin, pos, slots = _rope_case(2, 4, 2, 16, torch.float32, device, 1, [3, 4])
    kc = torch.zeros(64, 2, 16, device=device)
    with pytest.raises(ValueError, match="v_flat"):
        wrong = torch.zeros(64, 3, 16, device=device)
        fk.rope_store(qkv[:, :6], qkv[:, 6:], cos, sin, pos, kc, wrong, slots, 4)
    with pytest.raises(ValueError, match="cos"):
        fk.rope_store(qkv[:, :6], qkv[:, 6:], cos[:, :8], sin, pos, kc, kc.clone(), slots, 4)
    with pytest.raises(ValueError, match="heads contiguous"):
        fk.rope_store(qkv[:, :6].transpose(1, 2).contiguous().transpose(1, 2), qkv[:, 6:], cos, sin, pos, kc,
                      kc.clone(), slots, 4)  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", fk.ACTIVATIONS)
@pytest.mark.parametrize("I", [96, 1536, 3000])
def test_glu_matches_reference(device, dtype, act, I):
    gu = _rand(3, 2 * I, dtype=dtype, device=device, seed=9, scale=3.0)
    got = fk.glu(gu, act)
    want = fk.glu_reference(gu, act)
    assert got.shape == (3, I) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2  # (bf16: an ulp, where the activation rounds apart)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    one = fk.glu(gu[1:2], act)
    assert torch.equal(one[0], got[1])
    with pytest.raises(ValueError, match="act must be one of"):
        fk.glu(gu, "relu")


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs TRITON_INTERPRET=0")
def test_dependent_launches_give_the_serial_bits():
    """A layer's chain on CUDA in a CUDA graph, captured with programmatic dependent launches
    (``PDL_ROWS`` raised to the chain's rows) and without: cuBLAS matmul -> add_rms_norm ->
    matmul -> rope_store (the keys written to the cache) -> split paged attention over them ->
    matmul -> glu. Every replay, on new inputs, gives the same bits both ways: a kernel that read
    its input before the kernel writing it had ended would not."""
    from deepinfer.kernels import paged_attention as pa
    from deepinfer.kernels.triton_common import pdl_device

    rows = fk.PDL_ROWS
    if not pdl_device(torch.device("cuda")):
        pytest.skip("programmatic dependent launch needs compute capability 9 and a Triton that has it")
    dt, N, nh, nkv, hd, I, bs = torch.bfloat16, 4, 8, 2, 64, 1024, 16
    H = nh * hd
    _, cos, sin, _, _ = _rope_case(N, nh, nkv, hd, dt, "cuda", 0, [0] * N)
    w_in = _rand(H, H, dtype=dt, device="cuda", seed=1, scale=H**-0.5)
    ln = _rand(H, dtype=dt, device="cuda", seed=2).abs() + 0.5
    w_qkv = _rand(H, (nh + 2 * nkv) * hd, dtype=dt, device="cuda", seed=3, scale=H**-0.5)
    w_gu = _rand(H, 2 * I, dtype=dt, device="cuda", seed=4, scale=H**-0.5)
    blocks = 64
    x, d = torch.zeros(N, H, dtype=dt, device="cuda"), torch.zeros(N, H, dtype=dt, device="cuda")
    pos = torch.zeros(N, dtype=torch.int64, device="cuda")
    seq_ids = torch.arange(N, device="cuda")
    tables = torch.arange(N * (blocks // N), device="cuda").view(N, blocks // N)
    slots = torch.zeros(N, dtype=torch.int64, device="cuda")

    def layer(cache):
        k_flat, v_flat = (c.view(-1, nkv, hd) for c in cache)
        s, h = fk.add_rms_norm(x @ w_in, d, ln, 1e-5)
        qkv = (h @ w_qkv).view(N, nh + 2 * nkv, hd)
        q = fk.rope_store(qkv[:, : nh + nkv], qkv[:, nh + nkv :], cos, sin, pos, k_flat, v_flat, slots, nh)
        a = pa.paged_attention_triton(q.view(N, nkv, nh // nkv, hd), cache[0], cache[1], tables, seq_ids, pos,
                                      splits=4)  # fmt: skip
        return s, fk.glu(a.view(N, H) @ w_gu, "silu")

    def capture(on: bool):
        fk.PDL_ROWS = N if on else 0
        try:
            cache = [torch.randn(blocks, bs, nkv, hd, device="cuda").to(dt) for _ in range(2)]
            layer(cache)  # (sizes the split's counters before the capture)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = layer(cache)
            return graph, out, cache
        finally:
            fk.PDL_ROWS = rows

    (ga, oa, ca), (gb, ob, cb) = capture(True), capture(False)
    cb[0].copy_(ca[0]), cb[1].copy_(ca[1])
    gen = torch.Generator().manual_seed(5)
    for step in range(20):
        x.copy_(torch.randn(N, H, generator=gen) * 2)
        d.copy_(torch.randn(N, H, generator=gen))
        pos.copy_(torch.randint(0, blocks // N * bs, (N,), generator=gen))
        slots.copy_(seq_ids * (blocks // N) * bs + pos)  # each row's own table: blocks in order
        ga.replay()
        gb.replay()
        torch.cuda.synchronize()
        for a, b in zip(oa, ob):
            assert torch.equal(a, b), step
        assert torch.equal(ca[0], cb[0]) and torch.equal(ca[1], cb[1]), step
