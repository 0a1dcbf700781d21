"""Model families: what sets one decoder apart from another, as data.

Every family runs through one generic decoder (`deepinfer.models.llama.LlamaModel`); a `Family`
says which of its optional parts a checkpoint of that family uses. The sizes that vary from one
model of a family to the next (windows, RoPE bases, soft-caps, expert counts) live in
`deepinfer.config.ModelConfig`, read from config.json or GGUF metadata.

A family is found by config.json's ``architectures`` (e.g. "Qwen3ForCausalLM"), else its
``model_type``, or by GGUF's ``general.architecture``. Pure data: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    name: str  # ModelConfig.architecture (the HF model_type)
    hf_classes: tuple[str, ...]  # config.json "architectures" entries
    gguf: tuple[str, ...] = ()  # llama.cpp general.architecture values
    hidden_act: str = "silu"  # the gate's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    norm_offset: bool = False  # RMSNorm scales by (1 + w) (Gemma), folded into w at load
    qk_norm: bool = False  # RMSNorm over each q and k head before RoPE (q_norm / k_norm)
    sandwich_norms: bool = False  # norms after attention and after the MLP too (Gemma 2/3)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size) (Gemma)
    fused_qkv: bool = False  # self_attn.qkv_proj and mlp.gate_up_proj (Phi-3)
    windows: str = "none"  # sliding window: "none", "all" (every layer: Mistral) or "layer_types"
    moe: bool = False  # mlp.gate router + mlp.experts.{e} (Qwen3-MoE)
    attention_bias: bool = False  # q/k/v carry biases by default (Qwen2)
    gguf_permute: bool = False  # llama.cpp stores q/k rows permuted for its RoPE


_FAMILIES = (
    Family("llama", ("LlamaForCausalLM",), ("llama",), gguf_permute=True),
    Family("smollm", (), ("smollm",), gguf_permute=True),
    Family("smollm3", ("SmolLM3ForCausalLM",), ("smollm3",)),
    Family("mistral", ("MistralForCausalLM",), ("mistral",), windows="all", gguf_permute=True),
    Family("qwen2", ("Qwen2ForCausalLM",), ("qwen2",), attention_bias=True, windows="layer_types"),
    Family("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), qk_norm=True, windows="layer_types"),
    Family(
        "qwen3_moe", ("Qwen3MoeForCausalLM",), ("qwen3moe",), qk_norm=True, moe=True, windows="layer_types"
    ),
    Family("phi3", ("Phi3ForCausalLM",), ("phi3",), fused_qkv=True, windows="all"),
    Family(
        "gemma3_text",
        ("Gemma3ForCausalLM",),
        ("gemma3",),
        hidden_act="gelu_tanh",
        norm_offset=True,
        qk_norm=True,
        sandwich_norms=True,
        embed_scale=True,
        windows="layer_types",
    ),
)
_FAMILIES += (
    Family(
        "gemma2",
        ("Gemma2ForCausalLM",),
        hidden_act="gelu_tanh",
        norm_offset=True,
        sandwich_norms=True,
        embed_scale=True,
        windows="layer_types",
    ),
)
FAMILIES = {f.name: f for f in _FAMILIES}
BY_HF_CLASS = {c: f for f in _FAMILIES for c in f.hf_classes}
BY_GGUF = {g: f for f in _FAMILIES for g in f.gguf}
SUPPORTED_HF_CLASSES = tuple(BY_HF_CLASS)


def _bad(key: str, value: Any, expected: str) -> ValueError:
    shown = (
        f"<{type(value).__name__} of length {len(value)}>"
        if isinstance(value, (list, tuple))
        else repr(value)
    )
    return ValueError(f"{key}={shown[:60]}: expected {expected}")


def _count(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _bad(key, v, "an integer >= 1")
    return v


def hf_family(d: dict[str, Any]) -> Family:
    """The family of a config.json: its first ``architectures`` entry, else its ``model_type``."""
    classes = d.get("architectures")
    if classes:
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise _bad("architectures", classes, "a list of class names")
        if classes[0] not in BY_HF_CLASS:
            raise ValueError(
                f"architecture {classes[0]!r} (config.json architectures) is not supported "
                f"(supported: {', '.join(SUPPORTED_HF_CLASSES)})"
            )
        return BY_HF_CLASS[classes[0]]
    arch = d.get("model_type", "llama")
    if arch not in FAMILIES:
        raise ValueError(f"model_type {arch!r:.60} is not supported (supported: {', '.join(FAMILIES)})")
    return FAMILIES[arch]


def hf_layer_windows(d: dict[str, Any], fam: Family, n_layers: Any) -> list[Any]:
    """Per-layer sliding windows of a config.json (0: a global layer; [] when there are none).
    The window values themselves are checked by ModelConfig."""
    window = d.get("sliding_window")
    if fam.windows == "none" or window is None:
        return []
    n = _count("num_hidden_layers", n_layers)
    if fam.windows == "all":
        return [window] * n
    types = d.get("layer_types")
    if types is None:
        if fam.name in ("gemma2", "gemma3_text"):  # configs written before layer_types
            p = _count(
                "sliding_window_pattern",
                d.get("sliding_window_pattern", 6 if fam.name == "gemma3_text" else 2),
            )
            types = ["sliding_attention" if (i + 1) % p else "full_attention" for i in range(n)]
        elif d.get("use_sliding_window"):  # Qwen: the layers from max_window_layers on
            start = d.get("max_window_layers", 0)
            types = ["sliding_attention" if i >= start else "full_attention" for i in range(n)]
        else:
            return []
    if not isinstance(types, list) or len(types) != n:
        raise _bad("layer_types", types, f"a list of {n} layer types (num_hidden_layers={n})")
    for t in types:
        if t not in ("sliding_attention", "full_attention"):
            raise _bad("layer_types", t, "'sliding_attention' or 'full_attention'")
    if not fam.name.startswith("gemma") and not d.get("use_sliding_window", True):
        return []  # Qwen: a sliding_window that use_sliding_window turns off
    return [window if t == "sliding_attention" else 0 for t in types]
