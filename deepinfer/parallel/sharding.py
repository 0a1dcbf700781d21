"""Megatron-style tensor-parallel split of a checkpoint: rank r of N gets its share of every layer's
weights, as a smaller checkpoint of the same family that `LlamaModel` loads as it is.

- q / k / v rows (and their biases) by attention head: rank r keeps q heads
  ``[r nh/N, (r+1) nh/N)`` and the KV heads of the same groups (column parallel);
- ``o_proj`` by its input columns, the same heads (row parallel: the ranks' products are summed);
- ``gate_proj`` / ``up_proj`` rows and ``down_proj`` columns by the intermediate dimension;
- the LM head by vocabulary rows (padded with zero rows to a multiple of N; the logits are gathered
  and cut back to V before sampling); the embedding, norms and q/k norms stay whole.

The shard's config has nh / N, nkv / N and I / N: the decoder runs it as a narrower model, and
`deepinfer.parallel.comm.Group` adds the all-reduce after ``o_proj`` and ``down_proj``.
"""

from __future__ import annotations

import dataclasses

import torch

from ..config import ModelConfig


def check_tensor_parallel(config: ModelConfig, n: int) -> None:
    """ValueError naming the sizes when ``config`` cannot be split over ``n`` ranks."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {n!r}")
    if config.num_experts:
        raise ValueError(
            f"tensor_parallel_size={n}: the mixture-of-experts family ({config.architecture}) is split "
            "by expert_parallel_size instead"
        )
    for what, v in (
        ("num_attention_heads", config.num_heads),
        ("num_key_value_heads", config.num_kv_heads),
        ("intermediate_size", config.intermediate_size),
    ):
        if v % n:
            raise ValueError(
                f"tensor_parallel_size={n} does not divide {what}={v}: each rank needs a whole share"
            )


def _rows(w: torch.Tensor, r: int, n: int) -> torch.Tensor:
    k = w.shape[0] // n
    return w[r * k : (r + 1) * k]


def shard_config(config: ModelConfig, n: int) -> ModelConfig:
    """The config of one rank's shard."""
    return dataclasses.replace(
        config,
        num_heads=config.num_heads // n,
        num_kv_heads=config.num_kv_heads // n,
        intermediate_size=config.intermediate_size // n,
        tie_word_embeddings=False,  # each rank's head is its own vocabulary shard
    )


def shard_weights(config: ModelConfig, weights: dict[str, torch.Tensor], rank: int, n: int) -> dict:
    """Rank ``rank``'s share of ``weights`` (HF names and layouts), as views where possible."""
    check_tensor_parallel(config, n)
    hd, nh, nkv = config.head_dim, config.num_heads, config.num_kv_heads
    out: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        base = name.removeprefix("model.")
        leaf = base.rsplit(".", 2)
        part = ".".join(leaf[-2:]) if len(leaf) >= 2 else base
        if part in ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
                    "v_proj.bias", "gate_proj.weight", "up_proj.weight"):  # fmt: skip
            w = _rows(w, rank, n)
        elif part in ("o_proj.weight", "down_proj.weight"):
            w = _rows(w.t(), rank, n).t()
        elif part == "qkv_proj.weight":  # Phi-3: q | k | v fused
            q, k, v = w.split([nh * hd, nkv * hd, nkv * hd])
            w = torch.cat([_rows(q, rank, n), _rows(k, rank, n), _rows(v, rank, n)])
        elif part == "gate_up_proj.weight":  # Phi-3: gate | up fused
            g, u = w.chunk(2)
            w = torch.cat([_rows(g, rank, n), _rows(u, rank, n)])
        elif base == "lm_head.weight":
            continue
        out[name] = w
    head = weights.get("lm_head.weight")
    if config.tie_word_embeddings or head is None:
        head = weights.get("model.embed_tokens.weight", weights.get("embed_tokens.weight"))
    V = head.shape[0]
    pad = -V % n
    if pad:
        head = torch.cat([head, head.new_zeros(pad, head.shape[1])])
    out["lm_head.weight"] = _rows(head, rank, n)
    return out
