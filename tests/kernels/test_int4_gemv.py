"""The C int4 GEMV with int8 activations (kernels/int4_gemv.py, int4_gemv.c): against its torch
reference (the same arithmetic, float64 sums) on random planes of odd sizes, a row's bits alone
and in a batch and over one or two threads, the matmul's dispatch on the number of rows, its
error against the dequantized matmul on the embedded model's own matrices, and the build (a
whole build loads; a corrupt one, or DEEPINFER_INT4_GEMV=0, leaves torch's kernel)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from deepinfer.kernels import int4_gemv as G
from deepinfer.kernels import quantized
from deepinfer.kernels.int4_weights import (
    GROUP,
    Int4Weight,
    dequantize_int4,
    int4_matmul,
    int4_rows,
    torch_layout_problem,
)

from .test_int4_weights import _weight

_CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="module", autouse=True)
def kernel(tmp_path_factory):
    """The loaded build: the installed one, else one built here (skipped without a C compiler)."""
    if not G.available():
        if not _CC:
            pytest.skip(f"no C compiler, so no C int4 GEMV ({G.STATE.why}): torch's int4 kernel runs")
        folder = str(tmp_path_factory.mktemp("gemv"))
        G.build(folder)
        assert G.load(folder), G.STATE.why
    return G.STATE


SHAPES = [
    (32, 64, 1, 1),
    (96, 192, 2, 3),
    (576, 960, 1, 1),
    (1504, 320, 1, 4),
    (608, 128, 2, 2),
    (576, 64, 2, 5),
]


@pytest.mark.parametrize("K,N,planes,rows", SHAPES)
def test_gemv_equals_its_reference_on_random_inputs(K, N, planes, rows):
    g = torch.Generator().manual_seed(K + N + planes + rows)
    w = _weight(K, N, planes, g)
    x = torch.randn(rows, K, generator=g).bfloat16()
    if K > GROUP:
        x[-1, :GROUP] = 0  # a group of zeros (d = 0)
    got = G.int4_gemv(x, w)
    want = G.int4_gemv_reference(x, w)
    assert got.shape == (rows, N) and got.dtype == torch.bfloat16
    # float32 sums against float64 ones, then one rounding to bfloat16: within a bfloat16 step
    tol = want.abs() * 2**-8 + want.abs().amax() * 1e-5
    assert bool(((got.float() - want).abs() <= tol).all())
    # the same numbers as torch's kernel but for the activations' int8 rounding: a small error
    exact = x.float() @ dequantize_int4(w)
    assert float((got.float() - exact).norm() / exact.norm()) < 0.02


def test_reference_quantization_rounds_each_group_to_int8():
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(1)).bfloat16()
    q, d, t = G.quantize_rows_reference(x)
    v = x.float().view(3, -1, GROUP)
    assert q.abs().amax() == 127 and bool((q.abs() <= 127).all())
    assert bool(((q * d[..., None] - v).abs() <= d[..., None] * (0.5 + 1e-4)).all())
    assert torch.equal(t, d * q.sum(-1))


def test_a_rows_bits_do_not_depend_on_its_batch_or_the_threads():
    g = torch.Generator().manual_seed(2)
    w = _weight(576, 2048, 1, g)  # above PARALLEL: split over threads when there are several
    assert w.k * w.n >= G.PARALLEL
    xs = torch.randn(4, 576, generator=g).bfloat16()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([G.int4_gemv(xs[r : r + 1], w) for r in range(4)])
        torch.set_num_threads(2)
        assert torch.equal(G.int4_gemv(xs, w), alone)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(G.int4_gemv(xs[1:3], w), alone[1:3])


@pytest.mark.parametrize("torch_reads", [True, False], ids=["torch-layout", "other-layout"])
def test_matmul_takes_the_gemv_for_a_few_rows_only(torch_reads, monkeypatch):
    """Where torch's int4 kernel reads the planes, a few rows take the C kernel and more rows
    torch's; where it reads another layout (its AVX2 build: the case is set here so that every
    machine runs it), every row takes the C kernel, `matmul_torch` too."""
    if torch_reads and not quantized.torch_reads_planes():
        pytest.skip(str(torch_layout_problem()))
    monkeypatch.setattr(quantized, "torch_reads_planes", lambda: torch_reads)
    g = torch.Generator().manual_seed(3)
    w = _weight(576, 192, 2, g)
    few = torch.randn(1, quantized.GEMV_ROWS, 576, generator=g).bfloat16()
    assert torch.equal(quantized.matmul(few, w), G.int4_gemv(few, w))
    many = torch.randn(quantized.GEMV_ROWS + 1, 576, generator=g).bfloat16()
    if torch_reads:
        assert torch.equal(quantized.matmul_torch(few, w), int4_matmul(few, w))
        assert torch.equal(quantized.matmul(many, w), int4_matmul(many, w))
    else:
        assert torch.equal(quantized.matmul_torch(few, w), G.int4_gemv(few, w))
        odd = many.t().contiguous().t()  # (not contiguous: copied for the C kernel)
        for mm in (quantized.matmul, quantized.matmul_torch):
            assert torch.equal(mm(odd, w), G.int4_gemv(many, w))
        with pytest.raises(ValueError, match="bfloat16 activations"):
            quantized.matmul(many.float(), w)
    assert torch.equal(quantized.matmul(few[0, :, :64].contiguous(), torch.ones(64, 8).bfloat16()),
                       few[0, :, :64] @ torch.ones(64, 8).bfloat16())  # fmt: skip


def test_error_on_the_embedded_models_matrices_is_small():
    """The default's own Q4_1 matrices and Q8_0 head (two planes), activations of a hidden
    state's scale: int8 activations cost under a percent of the product's norm."""
    from deepinfer import LLM

    llm = LLM()
    if llm.quantization != "gguf":
        pytest.skip(f"the CPU default here keeps no int4 planes ({llm.dtype}: no native bf16, or "
                    f"torch's int4 kernel reads another layout)")  # fmt: skip
    model = llm.model
    layer = model.layers[0]
    g = torch.Generator().manual_seed(4)
    for w in (layer.wqkv, layer.wd, model.lm_head):
        assert isinstance(w, Int4Weight)
        x = (torch.randn(1, w.k, generator=g) * 2).bfloat16()
        got = quantized.matmul(x, w).float()
        exact = x.float() @ dequantize_int4(w)
        assert float((got - exact).norm() / exact.norm()) < 0.01


def test_build_is_loaded_only_whole(tmp_path, monkeypatch):
    if not _CC:
        pytest.skip("no C compiler")
    state = dict(vars(G.STATE))
    try:
        so = G.build(str(tmp_path))
        assert G.load(str(tmp_path)) and G.STATE.isa in ("avx512-vnni", "avx-vnni", "avx2", "c")
        man = so[: -len(".so")] + ".json"
        with open(man, encoding="utf-8") as f:
            meta = json.load(f)
        with open(man, "w", encoding="utf-8") as f:  # a library that is not the one built
            json.dump({**meta, "sha256": "0" * 64}, f)
        assert not G.load(str(tmp_path)) and "does not match its manifest" in G.STATE.why
        monkeypatch.setenv(G.ENV, "0")
        assert not G.load(str(tmp_path)) and G.STATE.why == f"{G.ENV}=0"
        x = torch.randn(1, 64).bfloat16()
        w = _weight(64, 64, 1, torch.Generator().manual_seed(5))
        if quantized.torch_reads_planes():
            assert torch.equal(quantized.matmul(x, w), int4_matmul(x, w))  # torch's kernel then
        else:  # nothing here reads the planes: said, not computed wrongly
            with pytest.raises(RuntimeError, match=f"need the C kernel here \\({G.ENV}=0\\)"):
                quantized.matmul(x, w)
    finally:
        vars(G.STATE).update(state)


def test_columns_lookup_is_bit_for_bit_the_torch_one():
    g = torch.Generator().manual_seed(6)
    for K, N, planes in [(576, 192, 2), (96, 128, 1)]:
        w = _weight(K, N, planes, g)
        idx = torch.tensor([0, 5, 31, 32, 63, 64, N - 1, 5])
        assert torch.equal(G.int4_columns(w, idx), int4_rows(w, idx))
    with pytest.raises(IndexError, match="out of range"):
        G.int4_columns(w, torch.tensor([N]))
