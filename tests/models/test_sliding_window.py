"""Sliding-window (and soft-capped) attention in the paged kernels (kernels/paged_attention.py):
the torch path (batched and per-row), the per-token Triton kernel and the query-tiled prefill
kernel, each with ``window`` (and ``softcap``), against the float64 reference loop over keys
(p - window, p]; NaN in every slot the window leaves unread. TRITON_INTERPRET=1 runs the Triton
kernels on the CPU (CUDA rows: gpu)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deepinfer.kernels.paged_attention import (  # noqa: E402
    paged_attention_reference,
    paged_attention_torch,
    paged_attention_triton,
    paged_prefill_triton,
)
from tests.kernels.test_paged_attention import Batch, _batch  # noqa: E402

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
# (seq_len, query rows): decode rows before and past the window, a chunk after a cached prefix
# crossing a Triton key block (64), a whole prefill of 10
SPECS = [(1, 1), (37, 1), (90, 1), (72, 6), (10, 10)]


def _run(impl: str, x: Batch, window: int, softcap: float = 0.0) -> torch.Tensor:
    seq_ids, positions = x.rows
    if impl.startswith("triton") and (x.q.device.type == "cpu") != INTERPRET:
        pytest.skip("Triton runs on CPU only under TRITON_INTERPRET=1, on CUDA only without it")
    if impl == "triton":
        return paged_attention_triton(x.q, x.k_cache, x.v_cache, x.block_tables, seq_ids, positions,
                                      window=window, softcap=softcap)  # fmt: skip
    if impl == "triton_prefill":
        dev = x.q.device
        qs, lens = torch.tensor(x.query_start, device=dev), torch.tensor(x.seq_lens, device=dev)
        T = max(b - a for a, b in zip(x.query_start, x.query_start[1:]))
        return paged_prefill_triton(x.q, x.k_cache, x.v_cache, x.block_tables, qs, lens, T, window=window,
                                    softcap=softcap)  # fmt: skip
    return paged_attention_torch(x.q, x.k_cache, x.v_cache, x.block_tables, x.query_start, x.seq_lens,
                                 per_row=impl == "torch_rows", window=window, softcap=softcap)  # fmt: skip


def _poison_outside_windows(x: Batch, window: int) -> Batch:
    """NaN in every key no row of a sequence sees (before its first query's window)."""
    bs = x.k_cache.shape[1]
    for b, n in enumerate(x.seq_lens):
        T = x.query_start[b + 1] - x.query_start[b]
        for p in range(max(0, n - T + 1 - window)):
            blk = int(x.block_tables[b, p // bs])
            x.k_cache[blk, p % bs] = float("nan")
            x.v_cache[blk, p % bs] = float("nan")
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", ["torch", "torch_rows", "triton", "triton_prefill"])
@pytest.mark.parametrize(
    ("window", "softcap", "dtype"),
    [(1, 0.0, torch.float32), (5, 0.0, torch.float32), (70, 0.0, torch.bfloat16), (0, 1.5, torch.float32),
     (5, 2.0, torch.bfloat16)],
)  # fmt: skip
def test_window_and_softcap_match_reference(device, impl, window, softcap, dtype):
    """Soft-capped scores (Gemma 2) too: softcap * tanh(s / softcap) before the softmax."""
    x = _batch(SPECS, 1, 2, 16, 16, dtype, device)
    if window:
        x = _poison_outside_windows(x, window)
    got = _run(impl, x, window, softcap)
    assert not got.isnan().any()
    want = paged_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, *x.rows, window=window,
                                     softcap=softcap)  # fmt: skip
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=0)


@pytest.mark.parametrize("impl", ["torch", "triton", "triton_prefill"])
def test_window_past_every_length_is_full_attention(impl):
    """A window longer than every sequence changes no bit."""
    x = _batch(SPECS[:4], 1, 2, 16, 16, torch.float32, "cpu")
    assert torch.equal(_run(impl, x, 1000), _run(impl, x, 0))


@pytest.mark.parametrize("window", [-1, 2.0, True])
def test_bad_window_raises(window):
    x = _batch([(5, 1)], 1, 1, 16, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="expected window a host int >= 0"):
        _run("torch", x, window)
