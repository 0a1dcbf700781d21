"""Model configuration of every family the engine runs (Llama 2/3, SmolLM, Mistral, Qwen2/3,
Qwen3-MoE, Phi-3, Gemma 3; see `deepinfer.models.families`).

One flat dataclass; `from_hf` reads a Hugging Face `config.json` dict and `from_gguf` reads
llama.cpp metadata, so the model code never looks at either format. What a family always does
(norm kind, activation, q/k norm, ...) is its `Family`; what varies within a family (per-layer
sliding windows, a second RoPE base, soft-caps, experts) is a field here.

Values are never trusted: `__post_init__` checks every field (sizes, heads, RoPE, epsilon,
token ids) and `check_weights` checks weight shapes against them before anything is loaded.
A message names the key the user wrote (`source_keys`: field -> config.json or GGUF key).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .models.families import BY_GGUF, FAMILIES, Family, hf_family, hf_layer_windows

# HF model_type values this engine runs (ModelConfig.architecture), and GGUF general.architecture ones.
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
# GGUF general.architecture values the GGUF loader maps (gguf.py's tensor names cover these)
SUPPORTED_GGUF = ("llama", "smollm", "smollm3", "mistral", "qwen2", "qwen3", "gemma3")

MAX_SIZE = 2**31 - 1  # every size and token id must index an int32 tensor
_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "max_position_embeddings",
)
_MISSING = object()
_LAYER = re.compile(r"^layers\.(0|[1-9][0-9]*)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(0|[1-9][0-9]*)\.(.+)$")
_GLOBAL_WEIGHTS = ("embed_tokens.weight", "lm_head.weight", "norm.weight", "rope_freqs")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _show(v: Any) -> str:
    """A short repr for messages (arrays by type and length)."""
    if isinstance(v, (list, tuple)) or getattr(v, "ndim", 0):
        return f"<{type(v).__name__} of length {len(v)}>"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _bad(key: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"{key}={_show(value)}: expected {expected}")


def _size(key: str, v: Any) -> int:
    if not _is_int(v) or not 1 <= v <= MAX_SIZE:
        raise _bad(key, v, f"an integer in [1, {MAX_SIZE}]")
    return int(v)


def _positive(key: str, v: Any, below: float = math.inf) -> float:
    if not _is_real(v) or not math.isfinite(v) or not 0 < v < below:
        raise _bad(key, v, "a finite number > 0" + (f" and < {below:g}" if below < math.inf else ""))
    return float(v)


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
    # Per-layer sliding window (keys a query sees, itself included; 0: a global layer), one entry a
    # layer, or [] when every layer is global
    layer_windows: list[int] = field(default_factory=list)
    rope_local_theta: float | None = None  # RoPE base of the sliding-window layers (Gemma 3), unscaled
    attn_scale: float | None = None  # softmax scale; None: 1 / sqrt(head_dim) (Gemma: query_pre_attn_scalar)
    final_softcap: float | None = None  # logits = cap * tanh(logits / cap) (Gemma 2/3)
    attn_softcap: float | None = None  # attention scores = cap * tanh(scores / cap) (Gemma 2)
    # Mixture of experts (family.moe): every layer in moe_layers runs a top-k router over experts
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the top-k router weights to sum to 1
    moe_layers: list[bool] = field(default_factory=list)
    # field -> the key the user wrote (config.json or GGUF), for messages; the field name if absent
    source_keys: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def key(self, name: str) -> str:
        return self.source_keys.get(name, name)

    @property
    def family(self) -> Family:
        return FAMILIES[self.architecture]

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window (0: it attends to every earlier key)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def is_moe_layer(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]

    def _check_family_fields(self) -> None:
        key, L = self.key, self.num_layers
        w = self.layer_windows
        if not isinstance(w, (list, tuple)) or (w and len(w) != L):
            raise _bad(key("layer_windows"), w, f"a list of {L} windows ({key('num_layers')}={L})")
        for v in w:
            if not _is_int(v) or not 0 <= v <= MAX_SIZE:
                raise _bad(key("layer_windows"), v, f"a window size in [1, {MAX_SIZE}] (or 0: global)")
        self.layer_windows = [int(v) for v in w] if any(w) else []
        if self.rope_local_theta is not None:
            t = self.rope_local_theta
            if not _is_real(t) or not math.isfinite(t) or t <= 1:
                raise _bad(key("rope_local_theta"), t, "a finite number > 1")
            self.rope_local_theta = float(t)
        for name in ("attn_scale", "final_softcap", "attn_softcap"):
            if getattr(self, name) is not None:
                setattr(self, name, _positive(key(name), getattr(self, name)))
        if not self.family.moe:
            return
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            setattr(self, name, _size(key(name), getattr(self, name)))
        if self.num_experts_per_tok > self.num_experts:
            raise _bad(key("num_experts_per_tok"), self.num_experts_per_tok,
                       f"at most {key('num_experts')}={self.num_experts}")  # fmt: skip
        m = self.moe_layers
        if not isinstance(m, (list, tuple)) or len(m) != L:
            raise _bad(key("moe_layers"), m, f"a list of {L} flags ({key('num_layers')}={L})")
        self.moe_layers = [bool(x) for x in m]

    def __post_init__(self) -> None:
        key = self.key
        for name in _SIZES:
            setattr(self, name, _size(key(name), getattr(self, name)))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{key('num_heads')}={self.num_heads} is not a multiple of "
                f"{key('num_kv_heads')}={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise _bad(key("head_dim"), self.head_dim, "an even number (RoPE rotates pairs of dimensions)")
        self.rms_norm_eps = _positive(key("rms_norm_eps"), self.rms_norm_eps, below=1.0)
        # theta <= 1 makes inverse frequencies >= 1 (or infinite): garbage or NaN positions
        if not _is_real(self.rope_theta) or not math.isfinite(self.rope_theta) or self.rope_theta <= 1:
            raise _bad(key("rope_theta"), self.rope_theta, "a finite number > 1")
        self.rope_theta = float(self.rope_theta)
        self._check_rope_scaling()
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise _bad(key("architecture"), self.architecture, f"one of {', '.join(SUPPORTED_ARCHITECTURES)}")
        if self.bos_token_id is not None:
            self.bos_token_id = self._token_id(key("bos_token_id"), self.bos_token_id)
        if not isinstance(self.eos_token_ids, (list, tuple)):
            raise _bad(key("eos_token_ids"), self.eos_token_ids, "a list of token ids")
        self.eos_token_ids = [self._token_id(key("eos_token_ids"), t) for t in self.eos_token_ids]
        self._check_family_fields()

    def _token_id(self, key: str, v: Any) -> int:
        if not _is_int(v) or not 0 <= v < self.vocab_size:
            raise _bad(key, v, f"a token id in [0, {self.vocab_size}) ({self.key('vocab_size')})")
        return int(v)

    def _check_rope_scaling(self) -> None:
        s, where = self.rope_scaling, self.key("rope_scaling")
        if s is None:
            return
        if not isinstance(s, dict):
            raise _bad(where, s, "a mapping")
        kind = s.get("rope_type", s.get("type", "default"))
        if kind not in ("default", "linear", "llama3"):
            raise ValueError(
                f"{where}: rope_scaling type {kind!r} is not supported (supported: default, linear, llama3)"
            )
        if kind in ("linear", "llama3"):
            _positive(f"{where}.factor", s.get("factor"))
        if kind == "llama3":
            lo = _positive(f"{where}.low_freq_factor", s.get("low_freq_factor"))
            hi = _positive(f"{where}.high_freq_factor", s.get("high_freq_factor"))
            _positive(f"{where}.original_max_position_embeddings", s.get("original_max_position_embeddings"))
            if hi <= lo:
                raise _bad(f"{where}.high_freq_factor", hi, f"a number > low_freq_factor={lo:g}")

    # -- weights -----------------------------------------------------------------------------
    def num_parameters(self) -> int:
        """Parameters the config implies (a lower bound on what a checkpoint must hold)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        layer = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size
        if self.family.moe:  # a lower bound: every layer dense or sparse, whichever is smaller
            layer += 3 * h * (min(self.intermediate_size, self.num_experts * self.moe_intermediate_size)
                              - self.intermediate_size)  # fmt: skip
        heads = 1 if self.tie_word_embeddings else 2
        return self.num_layers * layer + heads * self.vocab_size * h + h

    def weight_shapes(self) -> dict[str, tuple[tuple[int, str], ...]]:
        """Weight name (HF, without "model."; `layers.{i}.` dropped for per-layer ones) -> shape,
        each dimension as (size, where it comes from)."""
        k, hd = self.key, self.head_dim
        hd_s = f"{k('head_dim')}={hd}"
        V = (self.vocab_size, f"{k('vocab_size')}={self.vocab_size}")
        H = (self.hidden_size, f"{k('hidden_size')}={self.hidden_size}")
        I = (self.intermediate_size, f"{k('intermediate_size')}={self.intermediate_size}")
        Q = (self.num_heads * hd, f"{k('num_heads')}={self.num_heads} x {hd_s}")
        KV = (self.num_kv_heads * hd, f"{k('num_kv_heads')}={self.num_kv_heads} x {hd_s}")
        QKV = (self.num_heads * hd + 2 * self.num_kv_heads * hd, f"{Q[1]} + 2 x {KV[1]}")
        I2 = (2 * self.intermediate_size, f"2 x {I[1]}")
        E = (self.num_experts, f"{k('num_experts')}={self.num_experts}")
        EI = (self.moe_intermediate_size, f"{k('moe_intermediate_size')}={self.moe_intermediate_size}")
        D = (hd, hd_s)
        return {
            "embed_tokens.weight": (V, H),
            "lm_head.weight": (V, H),
            "norm.weight": (H,),
            "rope_freqs": ((hd // 2, f"{hd_s} / 2"),),
            "input_layernorm.weight": (H,),
            "post_attention_layernorm.weight": (H,),
            "self_attn.q_proj.weight": (Q, H),
            "self_attn.k_proj.weight": (KV, H),
            "self_attn.v_proj.weight": (KV, H),
            "self_attn.q_proj.bias": (Q,),
            "self_attn.k_proj.bias": (KV,),
            "self_attn.v_proj.bias": (KV,),
            "self_attn.o_proj.weight": (H, Q),
            "mlp.gate_proj.weight": (I, H),
            "mlp.up_proj.weight": (I, H),
            "mlp.down_proj.weight": (H, I),
            "self_attn.qkv_proj.weight": (QKV, H),
            "mlp.gate_up_proj.weight": (I2, H),
            "self_attn.q_norm.weight": (D,),
            "self_attn.k_norm.weight": (D,),
            "pre_feedforward_layernorm.weight": (H,),
            "post_feedforward_layernorm.weight": (H,),
            "mlp.gate.weight": (E, H),
            "mlp.experts.*.gate_proj.weight": (EI, H),
            "mlp.experts.*.up_proj.weight": (EI, H),
            "mlp.experts.*.down_proj.weight": (H, EI),
        }

    def layer_weights(self, layer: int) -> list[str]:
        """The weights (`weight_shapes` names) layer ``layer`` reads, q/k/v biases excepted."""
        f = self.family
        names = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight"]
        names += (
            ["self_attn.qkv_proj.weight"] if f.fused_qkv else [f"self_attn.{x}_proj.weight" for x in "qkv"]
        )
        if f.qk_norm:
            names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        if f.sandwich_norms:
            names += ["pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"]
        if self.is_moe_layer(layer):
            names.append("mlp.gate.weight")
            names += [
                f"mlp.experts.{e}.{x}_proj.weight"
                for e in range(self.num_experts)
                for x in ("gate", "up", "down")
            ]
        elif f.fused_qkv:
            names += ["mlp.gate_up_proj.weight", "mlp.down_proj.weight"]
        else:
            names += ["mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
        return names

    def check_weights(
        self, shapes: Mapping[str, Sequence[int]], name_of: Callable[[str], str] | None = None
    ) -> None:
        """Raise ValueError unless the weights (HF name -> shape, read before any is loaded) are
        those this config implies: every one the model reads present, with the implied shape, and
        none in a layer >= num_layers. `name_of`: HF name without "model." -> the file's own name."""
        show = name_of or (lambda n: n)
        want = self.weight_shapes()
        layers: dict[int, set[str]] = {}
        present = set()
        for name, shape in shapes.items():
            short = name.removeprefix("model.")
            present.add(short)
            m = _LAYER.match(short)
            if m:
                i, part = int(m.group(1)), m.group(2)
                e = _EXPERT.match(part)
                pattern = f"mlp.experts.*.{e.group(2)}" if e else part
                if pattern not in want:
                    continue
                if i >= self.num_layers:
                    raise ValueError(
                        f"tensor {show(short)!r} belongs to layer {i}, but "
                        f"{self.key('num_layers')}={self.num_layers}"
                    )
                if e and int(e.group(1)) >= self.num_experts:
                    raise ValueError(
                        f"tensor {show(short)!r} belongs to expert {e.group(1)}, but "
                        f"{self.key('num_experts')}={self.num_experts}"
                    )
                layers.setdefault(i, set()).add(part)
            elif short not in _GLOBAL_WEIGHTS:
                continue
            else:
                part = pattern = short
            expected = want[pattern]
            if tuple(shape) != tuple(d for d, _ in expected):
                raise ValueError(
                    f"tensor {show(short)!r} has shape {list(shape)}, expected "
                    f"{[d for d, _ in expected]} = [{', '.join(why for _, why in expected)}]"
                )
        for name in ("embed_tokens.weight", "norm.weight"):
            if name not in present:
                raise ValueError(f"the checkpoint lacks weight {show(name)!r}")
        biases = [n for n in want if n.endswith(".bias")]
        for i in range(self.num_layers):  # stops at the first gap: at most len(shapes) rounds
            have = layers.get(i, set())
            required = self.layer_weights(i) + (biases if self.attention_bias else [])
            missing = [n for n in required if n not in have]
            if missing:
                raise ValueError(
                    f"the checkpoint lacks weight {show(f'layers.{i}.{missing[0]}')!r} "
                    f"({self.key('num_layers')}={self.num_layers})"
                )
            some = [n for n in biases if n in have]
            if some and len(some) != len(biases):
                raise ValueError(
                    f"layer {i}: q/k/v biases must be all present or all absent, got only "
                    f"{[show(f'layers.{i}.{n}') for n in some]}"
                )

    # -- readers -----------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> ModelConfig:
        if not isinstance(d, dict):
            raise ValueError(f"config.json holds {type(d).__name__}, not a JSON object")
        fam = hf_family(d)
        arch = fam.name

        def need(key: str) -> Any:
            if d.get(key) is None:
                raise ValueError(f"config.json lacks {key!r}")
            return d[key]

        # transformers >= 5 folds rope_theta/rope_scaling into `rope_parameters` (Gemma 3: one
        # mapping per layer type)
        rope = d.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise _bad("rope_parameters", rope, "a mapping")
        rope = dict(rope)
        local_rope = rope.get("sliding_attention")
        rope_key = "rope_parameters"
        if "full_attention" in rope:
            rope, rope_key = rope["full_attention"], "rope_parameters.full_attention"
            if not isinstance(rope, dict) or not isinstance(local_rope, (dict, type(None))):
                raise _bad("rope_parameters", d["rope_parameters"], "a mapping per layer type of mappings")
        default_theta = 1e6 if fam.name == "gemma3_text" else 10000.0  # (transformers' defaults)
        theta = d.get("rope_theta", rope.get("rope_theta", default_theta))
        scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
        if partial != 1.0:
            raise _bad("partial_rotary_factor", partial, "1.0 (partial rotary embeddings are not supported)")
        act = (
            d.get("hidden_activation")
            or d.get("hidden_act")
            or {"gelu_tanh": "gelu_pytorch_tanh"}.get(fam.hidden_act, fam.hidden_act)
        )
        acts = {"silu": ("silu", "swish"), "gelu_tanh": ("gelu_pytorch_tanh", "gelu_tanh")}[fam.hidden_act]
        if act not in acts:
            raise _bad("hidden_act", act, f"one of {', '.join(acts)} ({fam.name} uses {fam.hidden_act})")
        eos = d.get("eos_token_id")
        eos_ids = [] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [eos])
        n_heads, hidden = need("num_attention_heads"), need("hidden_size")
        keys = {
            "vocab_size": "vocab_size",
            "hidden_size": "hidden_size",
            "intermediate_size": "intermediate_size",
            "num_layers": "num_hidden_layers",
            "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads",
            "head_dim": "head_dim",
            "rms_norm_eps": "rms_norm_eps",
            "rope_theta": "rope_theta" if "rope_theta" in d else f"{rope_key}.rope_theta",
            "rope_scaling": "rope_scaling" if d.get("rope_scaling") else rope_key,
            "rope_local_theta": "rope_local_base_freq"
            if "rope_local_base_freq" in d
            else "rope_parameters.sliding_attention.rope_theta",
            "layer_windows": "sliding_window",
            "attn_scale": "query_pre_attn_scalar",
            "final_softcap": "final_logit_softcapping",
            "attn_softcap": "attn_logit_softcapping",
            "moe_layers": "mlp_only_layers / decoder_sparse_step",
            "max_position_embeddings": "max_position_embeddings",
            "bos_token_id": "bos_token_id",
            "eos_token_ids": "eos_token_id",
        }
        head_dim = d.get("head_dim")
        if head_dim is None:
            _size("num_attention_heads", n_heads)
            if _size("hidden_size", hidden) % n_heads:
                raise ValueError(
                    f"hidden_size={hidden} is not divisible by num_attention_heads={n_heads} "
                    "(and config.json gives no head_dim)"
                )
            head_dim = hidden // n_heads
            keys["head_dim"] = "head_dim (hidden_size / num_attention_heads)"
        n_kv = d.get("num_key_value_heads")
        if n_kv is None:
            n_kv, keys["num_kv_heads"] = n_heads, "num_attention_heads (no num_key_value_heads)"
        n_layers = need("num_hidden_layers")
        local_theta = None
        if fam.name == "gemma3_text":
            local_theta = d.get("rope_local_base_freq", (local_rope or {}).get("rope_theta", 10000.0))
        qpas = d.get("query_pre_attn_scalar")
        if qpas is not None:
            qpas = _positive("query_pre_attn_scalar", qpas) ** -0.5
        moe: dict[str, Any] = {}
        if fam.moe:
            step = _size("decoder_sparse_step", d.get("decoder_sparse_step", 1))
            only = d.get("mlp_only_layers") or []
            if not isinstance(only, list):
                raise _bad("mlp_only_layers", only, "a list of layer indices")
            experts_key = "num_experts" if d.get("num_experts") is not None else "num_local_experts"
            keys["num_experts"] = experts_key
            moe = dict(
                num_experts=need(experts_key),
                num_experts_per_tok=need("num_experts_per_tok"),
                moe_intermediate_size=need("moe_intermediate_size"),
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                moe_layers=[
                    i not in only and (i + 1) % step == 0 for i in range(_size("num_hidden_layers", n_layers))
                ],
            )
        return cls(
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_layers=n_layers,
            num_heads=n_heads,
            num_kv_heads=n_kv,
            head_dim=head_dim,
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=theta,
            rope_scaling=dict(scaling) if isinstance(scaling, dict) else scaling,
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", fam.attention_bias)),
            architecture=arch,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            layer_windows=hf_layer_windows(d, fam, n_layers),
            rope_local_theta=local_theta,
            attn_scale=qpas,
            final_softcap=d.get("final_logit_softcapping"),
            attn_softcap=d.get("attn_logit_softcapping"),
            source_keys=keys,
            **moe,
        )

    @classmethod
    def from_gguf(cls, meta: dict[str, Any], has_output_weight: bool, has_qkv_bias: bool) -> ModelConfig:
        arch = meta.get("general.architecture")  # (the prefix of the other keys)
        if not isinstance(arch, str) or arch not in SUPPORTED_GGUF:
            raise ValueError(
                f"GGUF architecture {_show(arch)} (general.architecture) is not supported "
                f"(supported: {', '.join(SUPPORTED_GGUF)})"
            )

        def get(key: str, default: Any = _MISSING) -> Any:
            v = meta.get(f"{arch}.{key}")
            if v is None:
                if default is _MISSING:
                    raise ValueError(f"GGUF metadata lacks {arch}.{key}")
                return default
            return v

        def integer(key: str, default: Any = _MISSING) -> int:
            v = get(key, default)
            if not _is_int(v):
                per_layer = " (per-layer arrays are not supported)" if getattr(v, "ndim", 0) else ""
                raise _bad(f"{arch}.{key}", v, "an integer" + per_layer)
            return int(v)

        def real(key: str, default: float) -> Any:
            v = get(key, default)
            return float(v) if _is_real(v) else v  # (the constructor names a bad one)

        keys = {
            "vocab_size": f"{arch}.vocab_size",
            "hidden_size": f"{arch}.embedding_length",
            "intermediate_size": f"{arch}.feed_forward_length",
            "num_layers": f"{arch}.block_count",
            "num_heads": f"{arch}.attention.head_count",
            "num_kv_heads": f"{arch}.attention.head_count_kv",
            "head_dim": f"{arch}.attention.key_length",
            "rms_norm_eps": f"{arch}.attention.layer_norm_rms_epsilon",
            "rope_theta": f"{arch}.rope.freq_base",
            "rope_scaling": f"{arch}.rope.scaling",
            "max_position_embeddings": f"{arch}.context_length",
            "architecture": "general.architecture",
            "bos_token_id": "tokenizer.ggml.bos_token_id",
            "eos_token_ids": "tokenizer.ggml.eos_token_id",
        }
        hidden = _size(keys["hidden_size"], integer("embedding_length"))
        n_heads = _size(keys["num_heads"], integer("attention.head_count"))
        tokens = meta.get("tokenizer.ggml.tokens")
        if f"{arch}.vocab_size" in meta:
            vocab = integer("vocab_size")
            if isinstance(tokens, list) and vocab != len(tokens):
                raise ValueError(
                    f"{arch}.vocab_size={vocab} but tokenizer.ggml.tokens has {len(tokens)} entries"
                )
        elif tokens is None:
            raise ValueError(
                f"GGUF metadata lacks tokenizer.ggml.tokens (no tokenizer) and {arch}.vocab_size"
            )
        elif not isinstance(tokens, list):
            raise _bad("tokenizer.ggml.tokens", tokens, "an array of strings")
        else:
            vocab, keys["vocab_size"] = len(tokens), "the length of tokenizer.ggml.tokens"
        if f"{arch}.attention.key_length" in meta:
            head_dim = integer("attention.key_length")
            value_dim = integer("attention.value_length", head_dim)
            if value_dim != head_dim:
                raise _bad(f"{arch}.attention.value_length", value_dim, f"{head_dim} (= key_length)")
        else:
            if hidden % n_heads:
                raise ValueError(
                    f"{arch}.embedding_length={hidden} is not divisible by "
                    f"{arch}.attention.head_count={n_heads} (and there is no {arch}.attention.key_length)"
                )
            head_dim = hidden // n_heads
            keys["head_dim"] = f"head_dim ({arch}.embedding_length / {arch}.attention.head_count)"
        if f"{arch}.rope.dimension_count" in meta and integer("rope.dimension_count") != head_dim:
            raise _bad(
                f"{arch}.rope.dimension_count",
                get("rope.dimension_count"),
                f"{head_dim} = {keys['head_dim']} (partial rotary embeddings are not supported)",
            )
        scaling = None
        kind = meta.get(f"{arch}.rope.scaling.type")
        if kind == "linear":
            scaling = {"rope_type": "linear", "factor": real("rope.scaling.factor", _MISSING)}
        elif kind not in (None, "none"):
            raise ValueError(
                f"GGUF rope scaling type {_show(kind)} ({arch}.rope.scaling.type) is not supported"
            )
        eos = meta.get("tokenizer.ggml.eos_token_id")
        if f"{arch}.attention.head_count_kv" not in meta:
            keys["num_kv_heads"] = f"{arch}.attention.head_count (no head_count_kv)"
        gemma: dict[str, Any] = {}
        if arch == "gemma3":  # as llama.cpp runs it: 5 of 6 layers windowed, local RoPE base 10000
            layers = integer("block_count")
            window = integer("attention.sliding_window", 0)
            keys["layer_windows"] = f"{arch}.attention.sliding_window"
            # the 27B (62 layers) scales by hidden / heads, the others by head_dim (llama.cpp)
            scalar = hidden / n_heads if layers == 62 else head_dim
            gemma = dict(
                layer_windows=[window if (i + 1) % 6 else 0 for i in range(layers)] if window else [],
                rope_local_theta=10000.0,
                attn_scale=scalar**-0.5,
            )
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=integer("feed_forward_length"),
            num_layers=integer("block_count"),
            num_heads=n_heads,
            num_kv_heads=integer("attention.head_count_kv", n_heads),
            head_dim=head_dim,
            rms_norm_eps=real("attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=real("rope.freq_base", 10000.0),
            rope_scaling=scaling,
            max_position_embeddings=integer("context_length", 4096),
            tie_word_embeddings=not has_output_weight,
            attention_bias=has_qkv_bias,
            architecture=BY_GGUF[arch].name,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=[] if eos is None else [eos],
            source_keys=keys,
            **gemma,
        )
