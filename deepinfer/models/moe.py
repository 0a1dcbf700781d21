"""A mixture-of-experts feed-forward block (Qwen3-MoE): a top-k router, then the experts.

Router (as transformers' Qwen3-MoE computes it): logits = x @ router, softmax in float32 over the
E experts, the k largest kept and, with ``norm_topk_prob``, renormalised to sum to 1; the weights
go back to x's dtype. The experts run through deepinfer.kernels.moe_experts: the Triton grouped
matmul on CUDA (no host sync: CUDA-graph capturable), the torch grouping on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels.moe_experts import moe_experts_torch, moe_experts_triton


@dataclass
class MoE:
    router: torch.Tensor  # [H, E] (for x @ router)
    w_gate_up: torch.Tensor  # [E, H, 2 I]: gate | up of each expert
    w_down: torch.Tensor  # [E, I, H]
    top_k: int
    renormalize: bool
    act: str = "silu"
    # the experts' implementation (kernels.moe_experts' signature); None: Triton on CUDA, torch else
    experts: Callable | None = None

    @classmethod
    def from_experts(cls, router: torch.Tensor, gate: list, up: list, down: list, *, top_k: int,
                     renormalize: bool, act: str = "silu") -> MoE:  # fmt: skip
        """router [E, H]; gate, up: E tensors [I, H]; down: E tensors [H, I] (HF layouts)."""
        w_gate_up = torch.stack([torch.cat([g, u]).t() for g, u in zip(gate, up)]).contiguous()
        w_down = torch.stack([d.t() for d in down]).contiguous()
        return cls(router.t().contiguous(), w_gate_up, w_down, top_k, renormalize, act)

    def route(self, x: torch.Tensor, mm) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [N, k] in x's dtype, expert ids [N, k] int64)."""
        probs = torch.softmax(mm(x, self.router).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def __call__(self, x: torch.Tensor, mm) -> torch.Tensor:
        weights, ids = self.route(x, mm)
        experts = self.experts or (moe_experts_triton if x.device.type == "cuda" else moe_experts_torch)
        return experts(x, self.w_gate_up, self.w_down, weights, ids, self.act)
