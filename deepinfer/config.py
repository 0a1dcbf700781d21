"""Model configuration for the Llama family (Llama 2/3, SmolLM, Mistral, Qwen2).

One flat dataclass; `from_hf` reads a Hugging Face `config.json` dict and `from_gguf` reads
llama.cpp metadata, so the model code never looks at either format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# HF model_type / GGUF general.architecture values this engine runs.
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "smollm", "smollm3")


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "llama3"|"linear", "factor": ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    architecture: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if kind not in ("default", "linear", "llama3"):
                raise ValueError(
                    f"rope_scaling type {kind!r} is not supported (supported: default, linear, llama3)"
                )

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> ModelConfig:
        arch = d.get("model_type", "llama")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"model_type {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        # transformers >= 5 folds rope_theta/rope_scaling into `rope_parameters`.
        rope = dict(d.get("rope_parameters") or {})
        theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        eos = d.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        n_heads = d["num_attention_heads"]
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=n_heads,
            num_kv_heads=d.get("num_key_value_heads") or n_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // n_heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            rope_scaling=dict(scaling) if scaling else None,
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", arch == "qwen2")),
            architecture=arch,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_gguf(cls, meta: dict[str, Any], has_output_weight: bool, has_qkv_bias: bool) -> ModelConfig:
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"GGUF architecture {arch!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )

        def get(key: str, default: Any = None) -> Any:
            v = meta.get(f"{arch}.{key}", default)
            if v is None:
                raise ValueError(f"GGUF metadata lacks {arch}.{key}")
            return v

        hidden = int(get("embedding_length"))
        n_heads = int(get("attention.head_count"))
        vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
        scaling = None
        kind = meta.get(f"{arch}.rope.scaling.type")
        if kind == "linear":
            scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
        elif kind not in (None, "none"):
            raise ValueError(f"GGUF rope scaling type {kind!r} is not supported")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=int(get("block_count")),
            num_heads=n_heads,
            num_kv_heads=int(get("attention.head_count_kv", n_heads)),
            head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // n_heads)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=int(get("context_length", 4096)),
            tie_word_embeddings=not has_output_weight,
            attention_bias=has_qkv_bias,
            architecture=arch,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=[] if eos is None else [int(eos)],
        )
