"""Mixture-of-experts feed-forward: each token through its top-k experts, weighted and summed.

    x: [N, H]; w_gate_up: [E, H, 2I] (gate | up, stored for x @ w); w_down: [E, I, H];
    topk_weights: [N, k] (x's dtype); topk_ids: [N, k] int64 (experts in [0, E)).

    out[n] = sum_j topk_weights[n, j] * (glu(x[n] @ w_gate_up[e, :, :I], x[n] @ w_gate_up[e, :, I:])
                                         @ w_down[e]),   e = topk_ids[n, j]

glu is "silu" (silu(gate) * up) or "gelu_tanh" (gelu(gate, tanh) * up). Three implementations:
- `moe_experts_reference`: that sum, a plain loop over experts (each over the tokens routed to
  it), in float64: the oracle of the tests.
- `moe_experts_torch` (CPU; any device): the (token, slot) pairs sorted by expert, one matmul per
  expert over its contiguous rows, scattered back by pair; reads the counts on the host.
- `moe_experts_triton` (CUDA; CPU under TRITON_INTERPRET=1): the same grouping as a grouped
  matmul with no host sync (CUDA-graph capturable): each expert's rows padded to whole tiles of
  BLOCK_M, one program per (tile, column block); see moe_experts_triton.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "gelu_tanh")


def _glu(h: torch.Tensor, act: str) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return (F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")) * up


def _check(fn: str, x, w_gate_up, w_down, topk_weights, topk_ids, act) -> None:
    if x.dim() != 2:
        raise ValueError(f"{fn}: expected x of shape [N, H], got {tuple(x.shape)}")
    N, H = x.shape
    if w_gate_up.dim() != 3 or w_gate_up.shape[1] != H or w_gate_up.shape[2] % 2:
        raise ValueError(f"{fn}: expected w_gate_up of shape [E, {H}, 2I], got {tuple(w_gate_up.shape)}")
    E, _, I2 = w_gate_up.shape
    if w_down.shape != (E, I2 // 2, H):
        raise ValueError(f"{fn}: expected w_down of shape [{E}, {I2 // 2}, {H}], got {tuple(w_down.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != N or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{fn}: expected topk_ids int64 of shape [{N}, k], got {topk_ids.dtype} "
                         f"{tuple(topk_ids.shape)}")  # fmt: skip
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"{fn}: expected topk_weights of topk_ids' shape {tuple(topk_ids.shape)}, "
                         f"got {tuple(topk_weights.shape)}")  # fmt: skip
    if act not in ACTIVATIONS:
        raise ValueError(f"{fn}: expected act one of {ACTIVATIONS}, got {act!r}")


def moe_experts_reference(x, w_gate_up, w_down, topk_weights, topk_ids, act: str = "silu") -> torch.Tensor:
    """The module docstring's sum as a plain loop over experts, float64 on CPU -> [N, H] float64."""
    _check("moe_experts_reference", x, w_gate_up, w_down, topk_weights, topk_ids, act)
    x, ids, wts = x.double().cpu(), topk_ids.cpu(), topk_weights.double().cpu()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for e in range(w_gate_up.shape[0]):
        tokens, slots = torch.where(ids == e)
        if tokens.numel() == 0:
            continue
        h = _glu(x[tokens] @ w_gate_up[e].double().cpu(), act) @ w_down[e].double().cpu()
        out.index_add_(0, tokens, h * wts[tokens, slots, None])
    return out


def moe_experts_torch(x, w_gate_up, w_down, topk_weights, topk_ids, act: str = "silu") -> torch.Tensor:
    """[N, H] in x's dtype: pairs grouped by expert, one matmul pair per expert that has rows."""
    _check("moe_experts_torch", x, w_gate_up, w_down, topk_weights, topk_ids, act)
    N, k = topk_ids.shape
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pair indices grouped by expert
    counts = torch.bincount(flat, minlength=w_gate_up.shape[0]).tolist()
    rows = x[order // k]  # [N k, H]: each pair's token, in expert order
    out_pairs = torch.empty(N * k, x.shape[1], dtype=x.dtype, device=x.device)
    start = 0
    for e, c in enumerate(counts):
        if c:
            seg = slice(start, start + c)
            out_pairs[order[seg]] = _glu(rows[seg] @ w_gate_up[e], act) @ w_down[e]
            start += c
    out_pairs.mul_(topk_weights.reshape(-1, 1))
    return out_pairs.view(N, k, -1).sum(1)


def moe_experts_triton(x, w_gate_up, w_down, topk_weights, topk_ids, act: str = "silu") -> torch.Tensor:
    """[N, H] in x's dtype; no host sync. Weights need last dims contiguous (stride 1)."""
    _check("moe_experts_triton", x, w_gate_up, w_down, topk_weights, topk_ids, act)
    if w_gate_up.stride(-1) != 1 or w_down.stride(-1) != 1:
        raise ValueError("moe_experts_triton: expected w_gate_up and w_down contiguous in the last dim")
    from .moe_experts_triton import grouped_experts

    return grouped_experts(x.contiguous(), w_gate_up, w_down, topk_weights.contiguous(),
                           topk_ids.contiguous(), act)  # fmt: skip
