"""Batch-invariant matmul and RMSNorm (kernels/invariant.py): close to torch, and a row's bits the
same whatever the number of rows and wherever the row sits; then the deterministic decode built
on them (with the Triton attention) across batch compositions.

TRITON_INTERPRET=1 must be set before the kernels are imported so that they run on CPU (there
16-bit operands of tl.dot go to float32 first); on a GPU run with TRITON_INTERPRET=0 (the CUDA
rows are marked gpu)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deepinfer.config import ModelConfig  # noqa: E402
from deepinfer.kernels import invariant as bi  # noqa: E402
from deepinfer.model_runner import ModelRunner  # noqa: E402
from deepinfer.models.llama import LlamaModel  # noqa: E402
from tests.engine.test_deterministic import _runner_logits  # noqa: E402
from tests.kernels._util import TRITON_DEVICES  # noqa: E402

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEVICES = TRITON_DEVICES
# (K, N): one block; K and N not multiples of the blocks; K split in two (N narrow); split in 3
SHAPES = [(64, 64), (100, 70), (1100, 40), (1536, 96)]


def _rand(*shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device, dtype)


def test_config_depends_on_n_and_k_only_and_covers_k():
    from deepinfer.kernels import invariant_triton as kt

    assert kt.config(64, 64) == (64, 1, 64)
    for n, k in [(40, 1100), (96, 1536), (4096, 14336), (6144, 4096), (128256, 4096), (960, 576)]:
        block_n, splits, per = kt.config(n, k)
        assert per % kt.BLOCK_K == 0 and (splits - 1) * per < k <= splits * per
        assert per >= min(k, kt.MIN_K_PER_SPLIT) or splits == 1
    assert kt.config(40, 1100)[1] == 2 and kt.config(96, 1536)[1] == 3
    assert kt.config(4096, 14336) == (128, 3, 4800) and kt.config(128256, 4096)[1] == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("K", "N"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_matches_reference(device, K, N, dtype):
    a = _rand(19, K, dtype=dtype, device=device, seed=0)
    w = _rand(K, N, dtype=dtype, device=device, seed=1) / K**0.5
    got = bi.matmul(a, w)
    assert got.shape == (19, N) and got.dtype == dtype
    want = bi.matmul_reference(a, w)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    # leading dimensions are kept: [B, T, K] -> [B, T, N]
    assert torch.equal(bi.matmul(a[:18].view(3, 6, K), w), got[:18].view(3, 6, N))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("K", "N"), [(100, 70), (1536, 96)])
def test_matmul_row_bits_do_not_depend_on_the_batch(device, K, N):
    """Row 5 of 40 rows == the same row alone == at row 70 of 100 (another row block) beside
    other rows; bfloat16, with and without a K split."""
    a = _rand(40, K, dtype=torch.bfloat16, device=device, seed=2)
    w = _rand(K, N, dtype=torch.bfloat16, device=device, seed=3) / K**0.5
    full = bi.matmul(a, w)
    alone = bi.matmul(a[5:6], w)
    other = _rand(100, K, dtype=torch.bfloat16, device=device, seed=4)
    other[70] = a[5]
    moved = bi.matmul(other, w)
    assert torch.equal(full[5], alone[0]) and torch.equal(full[5], moved[70])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("K", "N"), [(1100, 40), (1536, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_splits_added_in_the_programs_give_the_partials_bits(device, K, N, dtype):
    """A prompt-sized product adds its K splits inside each program; a decode-sized one through
    float32 partials and a second kernel. Same splits, same order, same adds: same bits."""
    from deepinfer.kernels import invariant_triton as kt

    a = _rand(70, K, dtype=dtype, device=device, seed=7)
    w = _rand(K, N, dtype=dtype, device=device, seed=8) / K**0.5
    assert kt.config(N, K)[1] > 1
    inside = kt.matmul(a, w, splits_in=True)
    assert torch.equal(inside, kt.matmul(a, w, splits_in=False))
    torch.testing.assert_close(inside.float(), bi.matmul_reference(a, w).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tiles", [(128, 128, 8, 3), (128, 64, 4, 3), (64, 256, 8, 3)])
def test_matmul_tiles_do_not_change_a_rows_bits(device, tiles):
    """Other tiles for the prompt-sized way (PROMPT_TILES): each element is still summed by the
    same instructions in the same k order, so a row's bits are those of its decode tiles."""
    from deepinfer.kernels import invariant_triton as kt

    a = _rand(130, 1536, dtype=torch.bfloat16, device=device, seed=9)
    w = _rand(1536, 200, dtype=torch.bfloat16, device=device, seed=10) / 1536**0.5
    base = kt.matmul(a, w, splits_in=False)
    assert torch.equal(kt.matmul(a, w, splits_in=True, tiles=tiles), base)
    assert torch.equal(kt.matmul(a[:1], w, splits_in=False)[0], base[0])


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="interpreter: no TMA")
@pytest.mark.parametrize(("K", "N"), [(1112, 200), (4096, 384)])
@pytest.mark.parametrize("tiles", [None, (128, 128, 8, 3), (64, 128, 4, 3, 2)])
def test_tma_reads_give_the_pointer_loads_bits(K, N, tiles):
    """The splits-in way reading its tiles by TMA (`_mm_tma_kernel`) against the same way by
    masked pointer loads: the same keys into the same dots, zeros past M, N and K (1112 keys:
    a partial last block; 130 rows: a partial row block), so the same bits. A fifth tile entry
    orders the programs in groups of that many row blocks (here 3 row blocks: a partial last
    group), which changes no element's sum."""
    from deepinfer.kernels import invariant_triton as kt

    a = _rand(130, K, dtype=torch.bfloat16, device="cuda", seed=13)
    w = _rand(K, N, dtype=torch.bfloat16, device="cuda", seed=14) / K**0.5
    if not kt.tma_fits(a, w):
        pytest.skip("needs a GPU with TMA (compute capability 9 or more)")
    tiles = tiles or kt.PROMPT_TILES
    base = kt.matmul(a, w, splits_in=True, tiles=tiles, tma=False)
    assert torch.equal(kt.matmul(a, w, splits_in=True, tiles=tiles, tma=True), base)
    assert torch.equal(base[:1], kt.matmul(a[:1], w, splits_in=False))


@pytest.mark.parametrize("device", DEVICES)
def test_prompt_sized_products_keep_a_rows_bits(device, monkeypatch):
    """With the prompt threshold lowered to 3 programs, 100 rows of [1536] @ [1536, 96] take the
    prompt-sized way (2 x 2 programs) and 40 rows the decode way (1 x 2): row 5 is the same."""
    from deepinfer.kernels import invariant_triton as kt

    monkeypatch.setattr(kt, "PROMPT_PROGRAMS", 3)
    assert kt.prompt_sized(100, 96, 1536) and not kt.prompt_sized(40, 96, 1536)
    a = _rand(100, 1536, dtype=torch.bfloat16, device=device, seed=11)
    w = _rand(1536, 96, dtype=torch.bfloat16, device=device, seed=12) / 1536**0.5
    assert torch.equal(bi.matmul(a, w)[5], bi.matmul(a[:40], w)[5])


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_every_row_position_float32(device):
    """Each of 12 float32 rows alone == in the batch: no place in a row block rounds differently
    (the interpreter's numpy matmul did, at rows 6-11, on some CPUs)."""
    a = _rand(12, 128, dtype=torch.float32, device=device, seed=5)
    w = _rand(128, 64, dtype=torch.float32, device=device, seed=6)
    full = bi.matmul(a, w)
    differ = [i for i in range(12) if not torch.equal(bi.matmul(a[i : i + 1], w)[0], full[i])]
    assert differ == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_torch_and_is_row_invariant(device, dtype):
    x = _rand(9, 70, dtype=dtype, device=device, seed=5) * 3
    w = 1 + 0.1 * _rand(70, dtype=dtype, device=device, seed=6)
    got = bi.rms_norm(x, w, 1e-5)
    want = bi.rms_norm_reference(x, w, 1e-5)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    assert torch.equal(bi.rms_norm(x[4:5], w, 1e-5)[0], got[4])
    assert torch.equal(bi.rms_norm(x.view(3, 3, 70), w, 1e-5).view(9, 70), got)


def test_matmul_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"matmul of \[\.\.\., 8\] by \[9, 4\]"):
        bi.matmul(torch.zeros(2, 8), torch.zeros(9, 4))


def _small_model(device, dtype, vocab=384, bias=False):
    """A 2-layer GQA model with random weights and a small vocabulary (the interpreter runs one
    program per 64 logits)."""
    cfg = ModelConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    )
    g = torch.Generator().manual_seed(7)

    def rnd(*s, scale=0.15):
        return torch.randn(*s, generator=g) * scale

    w = {
        "embed_tokens.weight": rnd(vocab, 64, scale=0.3),
        "lm_head.weight": rnd(vocab, 64),
        "norm.weight": 1 + rnd(64, scale=0.1),
    }
    for i in range(2):
        p = f"layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + rnd(64, scale=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + rnd(64, scale=0.1)
        for name, shape in [("q", (64, 64)), ("k", (32, 64)), ("v", (32, 64)), ("o", (64, 64))]:
            w[p + f"self_attn.{name}_proj.weight"] = rnd(*shape)
            if bias and name != "o":
                w[p + f"self_attn.{name}_proj.bias"] = rnd(shape[0], scale=0.05)
        w[p + "mlp.gate_proj.weight"] = rnd(96, 64)
        w[p + "mlp.up_proj.weight"] = rnd(96, 64)
        w[p + "mlp.down_proj.weight"] = rnd(64, 96)
    return LlamaModel(cfg, w, dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [False, True], ids=["llama", "qkv-bias"])
def test_invariant_decode_alone_equals_batch(device, bias):
    """The deterministic runner with the invariant kernels (no tiles: one bucket of any size):
    a request's logits alone == as row 0 of a 12-row batch == as row 9 beside
    neighbours of other lengths; and it computes the model of the default path."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = _small_model(device, dtype, bias=bias)
    runner = ModelRunner(model, deterministic=True, invariant_kernels=True)
    assert runner.tile is None and runner.attention == "triton"
    prompts = [list(range(3 + 2 * i, 3 + 2 * i + 1 + 3 * (i % 5))) for i in range(12)]
    target = [1, 5, 9, 300, 301]
    kw = dict(invariant_kernels=True)
    alone = _runner_logits(model, [target], 3, 1, **kw)
    for at in (0, 9):
        ps = list(prompts)
        ps[at] = target
        batch = _runner_logits(model, ps, 3, 12, seed=at, **kw)  # other rows, other blocks
        for a, b in zip(alone, batch):
            assert torch.equal(a[0], b[at])
    default = _runner_logits(model, [target], 3, 1, deterministic=False)
    if dtype == torch.float32:  # every step (the greedy tokens agree)
        for a, b in zip(alone, default):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    else:  # the prefill's logits: the same input (bf16 rounding may flip a later greedy token)
        torch.testing.assert_close(alone[0], default[0], atol=0.1, rtol=0.05)


def test_invariant_kernels_need_triton_attention():
    model = _small_model("cpu", torch.float32)
    with pytest.raises(ValueError, match=r"attention must be one of \('triton',\)"):
        ModelRunner(model, deterministic=True, invariant_kernels=True, attention="torch")
