"""What every loader returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tokenizers
    import torch

    from ..config import ModelConfig
    from .plane_cache import PlaneCache


@dataclass
class LoadedModel:
    config: ModelConfig
    # HF names and layouts, e.g. "model.layers.0.self_attn.q_proj.weight" (a GGUF file's quantized
    # matrices may come as gguf_blocks.GGUFMatrix: load_model(keep_blocks=True))
    weights: dict[str, torch.Tensor]
    tokenizer: tokenizers.Tokenizer
    source: str  # path or repo id, for messages
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None
    add_bos_token: bool = False
    # a GGUF file loaded with keep_blocks: its matrices' int4 planes on disk (loader/plane_cache.py)
    planes: PlaneCache | None = None
