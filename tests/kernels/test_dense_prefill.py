"""dense_prefill (kernels/dense_prefill.py): a sequence's first tokens attended through torch's
SDPA on keys gathered from the paged cache, against paged_attention_torch. On the CPU through
torch's math backend (the gather, the layouts, GQA, causality); on CUDA through cuDNN, as the
forward runs it, and the forward's choice of it (gpu)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend

from deepinfer.kernels import dense_prefill as dense
from deepinfer.kernels.paged_attention import paged_attention_torch
from tests.kernels.test_paged_attention import _batch


def _reference(x) -> torch.Tensor:
    return paged_attention_torch(x.q, x.k_cache, x.v_cache, x.block_tables, x.query_start, x.seq_lens)


@pytest.mark.parametrize(
    ("n", "nkv", "g", "hd", "bs"), [(37, 2, 3, 16, 16), (64, 1, 4, 32, 8), (5, 3, 1, 8, 16)]
)
def test_matches_reference_on_the_cpu(n, nkv, g, hd, bs):
    """One fresh sequence of n tokens, its blocks shuffled and NaN past its length: the same
    outputs as the paged reference (float32, math backend)."""
    x = _batch([(n, n)], nkv, g, hd, bs, torch.float32, "cpu", seed=n)
    got = dense.dense_prefill(x.q, x.k_cache, x.v_cache, x.block_tables[0], backend=SDPBackend.MATH)
    assert got.shape == x.q.shape and not got.isnan().any()
    torch.testing.assert_close(got, _reference(x), atol=1e-5, rtol=1e-5)


def test_not_usable_off_cuda_or_in_float32():
    assert not dense.usable(torch.device("cpu"), torch.bfloat16)
    assert not dense.usable(torch.device("cuda"), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 3000])
def test_cudnn_matches_reference(n):
    """bf16 on CUDA through cuDNN (the forward's path), against the float32 reference."""
    if not dense.usable(torch.device("cuda"), torch.bfloat16):
        pytest.skip(f"torch's cuDNN attention is not usable here: {dense.REFUSED or 'disabled'}")
    x = _batch([(n, n)], 8, 4, 128, 16, torch.bfloat16, "cuda", seed=1)
    got = dense.dense_prefill(x.q, x.k_cache, x.v_cache, x.block_tables[0])
    xf = _batch([(n, n)], 8, 4, 128, 16, torch.float32, "cuda", seed=1)
    torch.testing.assert_close(got.float(), _reference(xf), atol=2e-2, rtol=2e-2)


def _prompt_logits(model, n: int) -> torch.Tensor:
    """The last-token logits of one n-token prompt prefilled in one forward (ModelRunner)."""
    from deepinfer.model_runner import ModelRunner
    from deepinfer.sampling_params import SamplingParams
    from deepinfer.sequence import Sequence

    runner = ModelRunner(model, cuda_graphs=False)
    blocks = -(-n // 16)
    runner.allocate(1 + blocks, 16, 1)
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    s = Sequence(0, None, [1 + i % 60 for i in range(n)], sp, seed=0, eos_token_ids=(), max_len=n + 8)
    s.block_table = list(range(1, 1 + blocks))
    return runner._forward([s], [n])


@pytest.mark.gpu
def test_forward_takes_the_dense_path_for_long_fresh_prompts(monkeypatch):
    """A 1,100-token prompt in one bf16 prefill forward on CUDA takes the dense path (counted),
    and its logits agree with paged_prefill_triton's (the path turned off)."""
    from tests.kernels.test_norm_matmul import _tiny_model

    calls = []
    real = dense.dense_prefill
    monkeypatch.setattr(dense, "dense_prefill", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = _tiny_model(torch.bfloat16, "cuda", max_len=2048)
    got = _prompt_logits(model, 1100)
    assert len(calls) == model.config.num_layers, "the dense path did not run in every layer"
    monkeypatch.setattr(dense, "MIN_TOKENS", 10**9)
    want = _prompt_logits(model, 1100)
    assert len(calls) == model.config.num_layers
    torch.testing.assert_close(got.float(), want.float(), atol=5e-2, rtol=5e-2)
