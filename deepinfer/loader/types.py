"""What every loader returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tokenizers
    import torch

    from ..config import ModelConfig


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # HF names and layouts, e.g. "model.layers.0.self_attn.q_proj.weight"
    tokenizer: tokenizers.Tokenizer
    source: str  # path or repo id, for messages
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None
    add_bos_token: bool = False
