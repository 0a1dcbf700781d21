"""The model of an engine split over ranks: tensor parallel or expert parallel."""

from __future__ import annotations


def parallel_model(source, loaded, *, tensor_parallel_size: int, expert_parallel_size: int, dtype, device,
                   max_len, deterministic: bool):  # fmt: skip
    """Rank 0's model of an engine split over worker ranks (their shards built beside it)."""
    from .tensor_parallel import tensor_parallel_model

    if tensor_parallel_size != 1 and expert_parallel_size != 1:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} with expert_parallel_size={expert_parallel_size}: "
            "one of the two at a time"
        )
    if expert_parallel_size != 1:
        from .experts import plan_experts

        placement = plan_experts(loaded, expert_parallel_size)
        size = expert_parallel_size
    else:
        size, placement = tensor_parallel_size, None
    return tensor_parallel_model(
        source, loaded, size, dtype=dtype, device=device, max_len=max_len, deterministic=deterministic,
        experts=placement,
    )  # fmt: skip
