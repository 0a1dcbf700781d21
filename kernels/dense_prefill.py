"""Attention of prompts with no earlier keys in the cache, through torch's cuDNN attention.

A sequence whose whole length so far is in this forward (a prompt in one chunk, or the first
chunk of a longer one) attends to its own keys only: plain causal attention over one
contiguous q, k and v, which cuDNN's fused attention (in torch's CUDA builds) runs at 1.5-2x
`paged_prefill_triton`'s speed on an H200 from 2k to 32k tokens
(`benchmarks/bench_attention.py --prefill ... --peers`, RESULTS.md). Its keys are read back
from the paged cache, where the forward has just stored them: a copy of 2 x T x nkv x hd
values, a few microseconds against milliseconds of attention.

    dense_prefill(q [T, nkv, g, hd], k_cache, v_cache, table [>= ceil(T / block_size)])
        -> o [T, nkv, g, hd]: o[t, h] = softmax(q[t, h] k[:t + 1]^T / sqrt(hd)) v[:t + 1],
        k and v the sequence's first T keys (blocks table[0], table[1], ...), GQA by KV head

`usable(device, dtype)`: whether the forward may take this path (CUDA, 16-bit, torch's cuDNN
attention enabled and not refused before). No soft-capping and no window narrower than the
prompt: the caller checks those per layer. `paged_attention_torch` is the reference
(tests/kernels/test_dense_prefill.py, on the CPU through torch's math backend).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

MIN_TOKENS = 1024  # shorter prompts stay on paged_prefill_triton (one launch for the whole batch)
REFUSED: list[str] = []  # cuDNN's error, once it has refused a shape: the path is off from then on


def usable(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cuda"
        and dtype in (torch.bfloat16, torch.float16)
        and torch.backends.cuda.cudnn_sdp_enabled()
        and not REFUSED
    )


def dense_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    backend: SDPBackend = SDPBackend.CUDNN_ATTENTION,
) -> torch.Tensor:
    """See the module docstring; `backend`: torch's SDPA backend (MATH in the CPU tests)."""
    T, nkv, g, hd = q.shape
    blocks = table[: -(-T // k_cache.shape[1])]
    k, v = (c[blocks].reshape(-1, nkv, hd)[:T].transpose(0, 1)[None] for c in (k_cache, v_cache))
    qh = q.reshape(T, nkv * g, hd).transpose(0, 1)[None]  # [1, heads, T, hd], views (BSHD strides)
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(qh, k, v, is_causal=True, enable_gqa=True)
    return o[0].transpose(0, 1).reshape(T, nkv, g, hd)
