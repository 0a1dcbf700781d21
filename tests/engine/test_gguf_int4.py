"""A GGUF file's Q4_0 / Q4_1 / Q8_0 matrices kept as int4 planes (loader/gguf_blocks.py), the
planes on disk (loader/plane_cache.py), and the CPU default that runs them (quantization="auto"):
the planes hold the file's weights exactly but for the bfloat16 rounding of the block scales; a
model built from them is close to the dequantized bfloat16 one; what they cannot run is refused."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.kernels.int4_weights import Int4Weight, dequantize_int4, int4_matmul, torch_layout_problem
from deepinfer.loader import load_model
from deepinfer.loader.gguf_blocks import Q4_0, Q4_1, Q8_0, GGUFMatrix, dequantize_blocks
from deepinfer.loader.gguf_file import GGUFError
from deepinfer.loader.plane_cache import PlaneCache


def _blocks(qtype: int, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Random blocks of a type: [rows, bytes a row], finite float16 scales (and minimums)."""
    rng = np.random.default_rng(seed)
    n = rows * cols // 32
    d = (rng.random(n) * 0.02 + 1e-3).astype(np.float16).view(np.uint8).reshape(n, 2)
    if qtype == Q8_0:
        body = [d, rng.integers(-128, 128, (n, 32)).astype(np.int8).view(np.uint8)]
    else:
        body = [d, rng.integers(0, 256, (n, 16), dtype=np.uint8)]
        if qtype == Q4_1:
            m = (rng.standard_normal(n) * 0.02).astype(np.float16).view(np.uint8).reshape(n, 2)
            body.insert(1, m)
    return torch.from_numpy(np.concatenate(body, axis=1).reshape(rows, -1).copy())


def _rounded_scales(raw: torch.Tensor, qtype: int, rows: int, cols: int) -> torch.Tensor:
    """The file's weights with each block's float16 numbers rounded to bfloat16, as the planes
    hold them: [rows, cols] float32."""
    b = raw.view(rows, cols // 32, -1)
    d = b[..., 0:2].contiguous().view(torch.float16).float().bfloat16().float()
    if qtype == Q8_0:
        q = b[..., 2:].contiguous().view(torch.int8).float()
        return (q * d).view(rows, cols)
    head = 2 if qtype == Q4_0 else 4
    qs = b[..., head:]
    q = torch.cat([qs & 15, qs >> 4], dim=-1).float()
    if qtype == Q4_0:
        return ((q - 8) * d).view(rows, cols)
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    zero = (m + 8 * b[..., 0:2].contiguous().view(torch.float16).float()).bfloat16().float()
    return ((q - 8) * d + zero).view(rows, cols)


@pytest.mark.parametrize("qtype", [Q4_0, Q4_1, Q8_0])
@pytest.mark.parametrize("rows,cols,chunk", [(64, 64, 4096), (192, 576, 4096), (320, 96, 128)])
def test_planes_hold_the_blocks_exactly_up_to_bf16_scales(qtype, rows, cols, chunk):
    """Rows past one conversion chunk included: chunks joined side by side."""
    raw = _blocks(qtype, rows, cols, seed=rows + qtype)
    m = GGUFMatrix(raw, qtype, cols)
    w = m.int4(chunk=chunk)
    assert isinstance(w, Int4Weight) and w.shape == (cols, rows)
    assert w.count == (2 if qtype == Q8_0 else 1)
    assert torch.equal(dequantize_int4(w), _rounded_scales(raw, qtype, rows, cols).t())
    exact = dequantize_blocks(raw, qtype).view(rows, cols)
    assert torch.equal(m.dequantize(), exact)
    assert (dequantize_int4(w).t() - exact).abs().max() <= exact.abs().max() * 2**-7
    index = torch.tensor([0, rows - 1, 33])
    assert torch.equal(m.rows(index), exact[index])
    if torch_layout_problem() is None:  # (torch's kernel reads the planes: its AVX-512 build)
        x = torch.randn(3, cols).bfloat16()
        ref = (x.float() @ exact.t()).bfloat16().float()
        tol = float(ref.abs().max()) * 2**-6
        torch.testing.assert_close(int4_matmul(x, w).float(), ref, rtol=0, atol=tol)


def test_what_planes_cannot_hold_and_nan_scales():
    raw = _blocks(Q4_1, 48, 64)
    assert GGUFMatrix(raw, Q4_1, 64).int4() is None  # 48 rows: the kernel takes tiles of 64
    bad = _blocks(Q8_0, 64, 64).clone()
    bad.view(64, 2, 34)[3, 1, 0:2] = torch.tensor([0, 0x7E], dtype=torch.uint8)  # a float16 NaN scale
    with pytest.raises(GGUFError, match="tensor 'blk.0.x' holds values that are not finite"):
        GGUFMatrix(bad, Q8_0, 64, name="tensor 'blk.0.x'").int4()


def test_plane_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path))
    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF stand-in")
    w = GGUFMatrix(_blocks(Q8_0, 128, 64), Q8_0, 64).int4()
    cache = PlaneCache(str(src))
    assert cache.get("head") is None
    cache.put("head", w)
    cache.save()
    cache.writer.join()
    again = PlaneCache(str(src)).get("head")
    assert again is not None and again.shape == w.shape and again.count == w.count == 2
    assert torch.equal(again.packed, w.packed) and torch.equal(again.scale_zeros, w.scale_zeros)
    x = torch.randn(2, 64).bfloat16()
    assert torch.equal(int4_matmul(x, again), int4_matmul(x, w))
    # a truncated file is ignored; so is every file when the cache is off
    (path,) = (tmp_path / "planes").iterdir()
    path.write_bytes(path.read_bytes()[:200])
    assert PlaneCache(str(src)).get("head") is None
    monkeypatch.setenv("DEEPINFER_PLANE_CACHE", "0")
    off = PlaneCache(str(src))
    off.put("head", w)
    off.save()
    assert off.path is None and PlaneCache(str(src)).get("head") is None
    monkeypatch.setenv("DEEPINFER_PLANE_CACHE", str(tmp_path / "elsewhere"))
    moved = PlaneCache(str(src))
    moved.put("head", w)
    moved.save(wait=True)
    assert moved.path.startswith(str(tmp_path / "elsewhere")) and PlaneCache(str(src)).get("head") is not None


@pytest.fixture(scope="module")
def default_llm(embedded_gguf_path):
    llm = LLM(None, device="cpu", seed=0, kv_cache_memory=32 << 20)
    if llm.quantization != "gguf":
        pytest.skip(f"the CPU default here is {llm.dtype} without int4 planes (no native bf16, or "
                    f"{torch_layout_problem()})")  # fmt: skip
    return llm


def test_cpu_default_keeps_the_files_blocks(default_llm):
    llm = default_llm
    assert llm.quantization == "gguf" and llm.dtype == torch.bfloat16
    layer = llm.model.layers[0]
    assert all(isinstance(m, Int4Weight) for m in (layer.wqkv, layer.wo, layer.wgu, layer.wd))
    assert isinstance(llm.model.lm_head, Int4Weight) and llm.model.lm_head.count == 2  # Q8_0
    assert llm.model.embed is llm.model.lm_head  # tied: the embedding reads the head's planes


def test_cpu_default_is_close_to_the_dequantized_model(default_llm, embedded_gguf_path):
    """The same prompts through the int4 planes and through the weights dequantized to bfloat16:
    the next-token distributions agree to rounding; greedy text agrees on most prompts."""
    dense = LLM(None, device="cpu", seed=0, quantization=None, dtype="bfloat16", kv_cache_memory=32 << 20)
    assert dense.quantization is None and not isinstance(dense.model.lm_head, Int4Weight)
    prompts = ["The capital of France is", "def fib(n):", "1, 2, 3, 4,", "Water boils at"]
    ids = [default_llm.tokenizer.encode(p) for p in prompts]
    a, b = default_llm.model.logits(ids), dense.model.logits(ids)
    for x, y in zip(a, b):
        px, py = torch.softmax(x[-1], -1), torch.softmax(y[-1], -1)
        assert (px - py).abs().sum() < 0.1  # total variation of the next-token distribution
        assert (x[-1] - y[-1]).abs().max() < 1.5  # logits (about 20-30 at the top) in bfloat16
    sp = SamplingParams(temperature=0, max_tokens=8)
    same = sum(
        o.token_ids == r.token_ids
        for o, r in zip(
            default_llm.generate(prompts, sp, use_tqdm=False), dense.generate(prompts, sp, use_tqdm=False)
        )
    )
    assert same >= 2


def test_gguf_quantization_refuses_what_it_cannot_run(tiny_folder, monkeypatch_session):
    with pytest.raises(ValueError, match="quantization='gguf' keeps a GGUF file's Q4_0, Q4_1 and Q8_0"):
        LLM(tiny_folder[0], device="cpu", quantization="gguf")
    with pytest.raises(ValueError, match="quantization='gguf' computes in bfloat16; dtype='float32'"):
        LLM(None, device="cpu", quantization="gguf", dtype="float32")
    llm = LLM(tiny_folder[0], device="cpu", kv_cache_memory=8 << 20)  # "auto": no blocks, no planes
    assert llm.quantization is None


def _under_torchs_plain_build(code: str, **env) -> str:
    """Run ``code`` in a process where torch dispatches its plain CPU kernels (forced by
    ATEN_CPU_CAPABILITY, so any x86 machine runs it); its stdout."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", **env}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_where_torch_reads_another_layout_the_c_kernel_takes_every_row(embedded_gguf_path):
    """torch's plain (or AVX2) build packs int4 in another layout than the planes': the CPU
    default then runs the planes through the C kernel, every row, and answers as the dense model
    does. Without the C kernel, "auto" keeps the weights dense and "gguf" asked for is refused,
    naming why."""
    from deepinfer.kernels import int4_gemv

    if not int4_gemv.available():
        pytest.skip(f"the C kernels are not built ({int4_gemv.STATE.why})")
    out = _under_torchs_plain_build(
        "import torch\n"
        "from deepinfer import LLM\n"
        "llm = LLM(None, device='cpu', kv_cache_memory=8 << 20)\n"
        "dense = LLM(None, device='cpu', quantization=None, dtype='float32', kv_cache_memory=8 << 20)\n"
        "ids = [llm.tokenizer.encode('The capital of France is')]\n"
        "x, y = (m.model.logits(ids)[0][-1].float() for m in (llm, dense))\n"
        "tv = float((torch.softmax(x, -1) - torch.softmax(y, -1)).abs().sum())\n"
        "print(llm.quantization, llm.dtype)\n"
        "top = [llm.tokenizer.decode([int(v.argmax())]) for v in (x, y)]\n"
        "print(tv, *top, sep='|')\n"
    )
    assert out.splitlines()[0] == "gguf torch.bfloat16", out
    tv, top, dense_top = out.splitlines()[1].split("|")
    assert float(tv) < 0.15 and top == dense_top == " Paris", out  # (read wrongly: garbage)
    out = _under_torchs_plain_build(
        "from deepinfer import LLM\n"
        "llm = LLM(None, device='cpu', dtype='bfloat16', kv_cache_memory=8 << 20)\n"
        "print(llm.quantization)\n"
        "try:\n"
        "    LLM(None, device='cpu', dtype='bfloat16', quantization='gguf')\n"
        "except ValueError as e:\n"
        "    print(e)\n",
        DEEPINFER_INT4_GEMV="0",
    )
    assert out.splitlines()[0] == "None", out
    why = "quantization='gguf' cannot run on this CPU: torch's int4 CPU kernel here (its DEFAULT build)"
    assert why in out and "DEEPINFER_INT4_GEMV=0" in out, out


def test_load_model_keeps_blocks_only_when_asked(embedded_gguf_path):
    kept = load_model(None, keep_blocks=True)
    assert isinstance(kept.weights["model.layers.0.mlp.up_proj.weight"], GGUFMatrix)
    assert kept.weights["model.norm.weight"].dtype == torch.float32
    assert kept.planes is not None
    plain = load_model(None)
    assert all(isinstance(t, torch.Tensor) for t in plain.weights.values()) and plain.planes is None
    q = "model.layers.2.self_attn.q_proj.weight"  # q's rows un-permuted from llama.cpp's order
    assert torch.equal(kept.weights[q].dequantize(), plain.weights[q])
