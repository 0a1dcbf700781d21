"""The norm + matmul (+ GLU) kernel (kernels/norm_matmul.py) against its reference, the unfused
ops, on random inputs; a row's bits the same alone and in a batch; where it serves; and a decode
step of a model through it.

TRITON_INTERPRET=1 must be set before the kernels are imported so that they run on CPU; on a GPU
run with TRITON_INTERPRET=0 (the CUDA rows are marked gpu)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deepinfer.kernels import norm_matmul as nm  # noqa: E402
from tests.kernels._util import TRITON_DEVICES  # noqa: E402

DEVICES = TRITON_DEVICES


def _rand(*shape, dtype, device, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device, dtype)


def _tol(device: str, dtype: torch.dtype) -> float:
    """float16 rounds as torch does under the interpreter, so the kernel is within a few ulps of
    the reference (the sums' orders). The interpreter casts float32 to bfloat16 by truncating,
    once at each of the chain's five roundings; on the GPU bfloat16 rounds to nearest."""
    if dtype == torch.float16:
        return 4e-3
    return 4e-2 if device == "cpu" else 2e-2


def _case(M, H, N, dtype, device, seed):
    x = _rand(M, H, dtype=dtype, device=device, seed=seed, scale=3.0)
    d = _rand(M, H, dtype=dtype, device=device, seed=seed + 1)
    ln = _rand(H, dtype=dtype, device=device, seed=seed + 2).abs() + 0.5
    w = _rand(H, N, dtype=dtype, device=device, seed=seed + 3, scale=H**-0.5)
    return x, d, ln, w


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("glu", [None, "silu", "gelu_tanh"])
@pytest.mark.parametrize(("M", "H", "N"), [(1, 576, 960), (3, 100, 70 * 2), (16, 64, 512), (7, 300, 66)])
def test_norm_matmul_matches_reference(device, dtype, glu, M, H, N):
    x, d, ln, w = _case(M, H, N, dtype, device, seed=M + H)
    tol = _tol(device, dtype)
    for dd in (d, None):  # with a residual, and the first layer's norm of x itself
        s, y = nm.norm_matmul(x, dd, ln, w, 1e-5, glu)
        s_ref, y_ref = nm.norm_matmul_reference(x, dd, ln, w, 1e-5, glu)
        assert y.dtype == dtype and y.shape == (M, N // 2 if glu else N)
        if dd is None:
            assert s is x
        elif device == "cuda" or dtype == torch.float16:
            assert torch.equal(s, s_ref)  # one rounding of an exact float32 sum: torch's bits
        scale = y_ref.float().abs().max().item()
        torch.testing.assert_close(y.float(), y_ref.float(), rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("device", DEVICES)
def test_norm_matmul_tiles_agree(device):
    """Every tiling gives the reference's values (the tiles a benchmark sweeps)."""
    x, d, ln, w = _case(2, 200, 96, torch.float16, device, seed=5)
    _, want = nm.norm_matmul_reference(x, d, ln, w, 1e-6, "silu")
    for tiles in [(16, 32, 4, 1), (32, 64, 4, 2), (64, 256, 8, 3)]:
        _, y = nm.norm_matmul(x, d, ln, w, 1e-6, "silu", tiles=tiles)
        torch.testing.assert_close(y, want, rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_norm_matmul_row_alone_equals_row_in_batch(device):
    x, d, ln, w = _case(16, 576, 192, torch.bfloat16, device, seed=9)
    s, y = nm.norm_matmul(x, d, ln, w, 1e-5, "silu")
    for r in (0, 7, 15):
        s1, y1 = nm.norm_matmul(x[r : r + 1], d[r : r + 1], ln, w, 1e-5, "silu")
        assert torch.equal(s1[0], s[r]) and torch.equal(y1[0], y[r])


def test_norm_matmul_rejects_bad_shapes():
    x, d, ln, w = _case(2, 64, 32, torch.float16, "cpu", seed=1)
    with pytest.raises(ValueError, match=r"ln \(32,\), w \(64, 32\): expected ln \[64\]"):
        nm.norm_matmul(x, d, ln[:32], w, 1e-5)
    with pytest.raises(ValueError, match="gate\\|up of odd width 31"):
        nm.norm_matmul(x, d, ln, w[:, :31], 1e-5, "silu")
    with pytest.raises(ValueError, match="glu must be one of"):
        nm.norm_matmul(x, d, ln, w, 1e-5, "relu")
    with pytest.raises(ValueError, match=r"d of shape \(1, 64\), expected x's \(2, 64\)"):
        nm.norm_matmul(x, d[:1], ln, w, 1e-5)
    # the q|k|v kernel: 2 q heads and 1 k|v head of 8 -> w [64, 32]
    kc, vc = torch.zeros(4, 1, 8, dtype=torch.float16), torch.zeros(4, 1, 8, dtype=torch.float16)
    cos = sin = torch.zeros(16, 8, dtype=torch.float16)
    pos, slots = torch.tensor([0, 1]), torch.tensor([2, 3])
    with pytest.raises(
        ValueError, match=r"w \(64, 24\), k_flat \(4, 1, 8\), nh=2: expected .* \[64, \(nh \+ 2 nkv\) hd\]"
    ):
        nm.norm_qkv_rope(x, d, ln, w[:, :24], 1e-5, cos, sin, pos, kc, vc, slots, 2)
    with pytest.raises(ValueError, match="each slot's heads contiguous"):
        nm.norm_qkv_rope(
            x, d, ln, w, 1e-5, cos, sin, pos, kc, vc.transpose(0, 2).contiguous().transpose(0, 2), slots, 2
        )
    with pytest.raises(ValueError, match=r"norm_qkv_rope: positions \(1,\) and slots \(2,\): expected \[2\]"):
        nm.norm_qkv_rope(x, d, ln, w, 1e-5, cos, sin, pos[:1], kc, vc, slots, 2)
    with pytest.raises(ValueError, match=r"norm_qkv_rope: cos \(16, 8\), sin \(16, 4\): expected \[L, 8\]"):
        nm.norm_qkv_rope(x, d, ln, w, 1e-5, cos, sin[:, :4], pos, kc, vc, slots, 2)


def test_where_the_kernel_serves(monkeypatch):
    """16-bit weights, a decode step's few rows, small matrices; never float32 (its speed was
    not measured), a matrix past MAX_BYTES, more rows than MAX_ROWS, or strided columns."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    w = torch.zeros(576, 960, dtype=torch.bfloat16)
    x = torch.zeros(1, 576, dtype=torch.bfloat16)
    assert nm.use_fused(x, w)
    assert nm.use_fused(torch.zeros(nm.MAX_ROWS, 576, dtype=torch.bfloat16), w)
    assert not nm.use_fused(torch.zeros(nm.MAX_ROWS + 1, 576, dtype=torch.bfloat16), w)
    assert not nm.use_fused(x.float(), w.float())
    big = torch.zeros(4096, nm.MAX_BYTES // 4096 // 2 + 1, dtype=torch.bfloat16)
    assert not nm.use_fused(torch.zeros(1, 4096, dtype=torch.bfloat16), big)
    assert not nm.use_fused(x, w.t().contiguous().t())  # columns not contiguous


def test_a_plain_product_of_one_row_takes_a_wide_matrix(monkeypatch):
    """Llama-3-8B's output projection (4096 x 4096, 32 MiB): past MAX_BYTES, the kernel serves it
    at one row as a plain product (no norm, no GLU), with WIDE_TILES; not at two rows, not with a
    norm, not a matrix of fewer columns (too few programs) or past WIDE_MAX_BYTES."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    o = torch.zeros(4096, 4096, dtype=torch.float16)
    one, two = torch.zeros(1, 4096, dtype=torch.float16), torch.zeros(2, 4096, dtype=torch.float16)
    assert o.numel() * 2 > nm.MAX_BYTES and not nm.use_fused(one, o)
    assert nm.use_fused(one, o, plain=True)
    assert not nm.use_fused(two, o, plain=True)
    assert not nm.use_fused(one, torch.zeros(8192, 2048, dtype=torch.float16), plain=True)  # 64 programs
    assert not nm.use_fused(one, torch.zeros(4096, 6144, dtype=torch.float16), plain=True)  # 48 MiB
    assert nm._launch(one, o, None, False)[1] == nm.WIDE_TILES
    assert nm._launch(two, torch.zeros(576, 960, dtype=torch.float16), None, False)[1] == nm.TILES[2]


@pytest.mark.parametrize("device", DEVICES)
def test_the_wide_tiles_give_the_matmul(device):
    """A row through Llama-3-8B's output projection with WIDE_TILES (what _launch picks for it)."""
    x = _rand(1, 4096, dtype=torch.float16, device=device, seed=3)
    w = _rand(4096, 4096, dtype=torch.float16, device=device, seed=4, scale=4096**-0.5)
    s, y = nm.norm_matmul(x, None, None, w, 1e-5)
    want = (x.float() @ w.float()).half()
    assert s is x
    torch.testing.assert_close(y, want, rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("nh", "nkv", "hd", "M"), [(9, 3, 64, 1), (4, 2, 16, 2), (3, 1, 24, 1), (32, 8, 128, 1)]
)
def test_norm_qkv_rope_matches_reference(device, dtype, nh, nkv, hd, M):
    """The norm, q|k|v projection, RoPE and K/V store in one launch: q, the stored k and v, and the
    residual against the unfused ops; no other cache slot touched."""
    from deepinfer.config import ModelConfig
    from deepinfer.models.layers import rope_inv_freq, rope_tables

    H = 96
    cfg = ModelConfig(vocab_size=8, hidden_size=H, intermediate_size=8, num_layers=1, num_heads=nh,
                      num_kv_heads=nkv, head_dim=hd, rope_theta=1e4, max_position_embeddings=512)  # fmt: skip
    cos, sin = rope_tables(rope_inv_freq(cfg), 512, device, dtype)
    x, d, ln, w = _case(M, H, (nh + 2 * nkv) * hd, dtype, device, seed=nh + hd)
    pos = torch.tensor([300, 7][:M], device=device)
    slots = torch.tensor([5, 2][:M], device=device)
    caches = [torch.full((8, nkv, hd), float("nan"), dtype=dtype, device=device) for _ in range(4)]
    s, q = nm.norm_qkv_rope(x, d, ln, w, 1e-5, cos, sin, pos, caches[0], caches[1], slots, nh)
    s_ref, q_ref = nm.norm_qkv_rope_reference(
        x, d, ln, w, 1e-5, cos, sin, pos, caches[2], caches[3], slots, nh
    )
    tol = _tol(device, dtype)
    if device == "cuda" or dtype == torch.float16:
        assert torch.equal(s, s_ref)
    assert q.shape == (M, nh, hd) and q.is_contiguous()
    for got, want in ((q, q_ref), (caches[0][slots], caches[2][slots]), (caches[1][slots], caches[3][slots])):
        scale = want.float().abs().max().item()
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * scale)
    untouched = torch.ones(8, dtype=torch.bool, device=device)
    untouched[slots] = False
    assert caches[0][untouched].isnan().all() and caches[1][untouched].isnan().all()


def _tiny_model(dtype, device, max_len: int = 128):
    """A 2-layer Llama of random weights (norm weights near 1, matrices scaled by 1/sqrt(fan-in))."""
    from deepinfer.config import ModelConfig
    from deepinfer.models.llama import LlamaModel

    cfg = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, rope_theta=1e4,
                      max_position_embeddings=max_len)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    shapes = cfg.weight_shapes()

    def make(name: str) -> torch.Tensor:
        size = [d for d, _ in shapes[name]]
        if "norm" in name:
            return torch.rand(*size, generator=g) + 0.5
        return torch.randn(*size, generator=g) * size[-1] ** -0.5

    w = {"model." + n: make(n) for n in ("embed_tokens.weight", "norm.weight")}
    w["lm_head.weight"] = make("lm_head.weight")
    for i in range(cfg.num_layers):
        for part in cfg.layer_weights(i):
            w[f"model.layers.{i}.{part}"] = make(part)
    return LlamaModel(cfg, w, dtype=dtype, device=device, max_len=max_len)


@pytest.mark.parametrize("device", DEVICES)
def test_a_decode_step_through_the_kernel_matches_the_unfused_ops(device, monkeypatch):
    """decode_static at batch 1 with the fused layer kernels: with fused_matmul every matmul of the
    step is a kernel of norm_matmul.py (the attention's norm, q|k|v, RoPE and K/V store; the
    output projection; the MLP's norm with gate|up and the GLU; the down projection; the LM
    head), and the logits are the unfused ops' within the roundings' ulps, step after step (each
    step reads the K/V the kernel stored)."""
    dtype = torch.float16
    model = _tiny_model(dtype, device)
    model.fused = True
    calls = []
    real = nm.norm_matmul

    def spy(x, d, ln, w, eps, glu=None, **kw):
        calls.append((ln is not None, glu))
        return real(x, d, ln, w, eps, glu, **kw)

    def spy_rope(*a, **kw):
        calls.append("norm, q|k|v, rope")
        return real_rope(*a, **kw)

    real_rope = nm.norm_qkv_rope
    monkeypatch.setattr(nm, "norm_matmul", spy)
    monkeypatch.setattr(nm, "norm_qkv_rope", spy_rope)
    outs = []
    for fused_matmul in (False, True):
        model.fused_matmul = fused_matmul
        cache = model.new_cache(8, 16)
        tables = torch.tensor([[1, 2]], dtype=torch.int32, device=device)
        steps = []
        for t, tok in enumerate([5, 9, 11, 3]):  # a prompt one token a step
            tok_t, pos_t = torch.tensor([tok], device=device), torch.tensor([t], device=device)
            slot = tables[:, 0].long() * 16 + t
            out = model.decode_static(tok_t, pos_t, slot, tables, cache, kv_len=32, attention="split")
            steps.append(out)
        outs.append(torch.cat(steps))
    layer = ["norm, q|k|v, rope", (False, None), (True, "silu"), (False, None)]
    assert calls == (layer * 2 + [(False, None)]) * 4  # two layers and the head, four steps
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-2, atol=2e-2)
    assert outs[1].argmax(-1).tolist() == outs[0].argmax(-1).tolist()
