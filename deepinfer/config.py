"""Model configuration for the Llama family (Llama 2/3, SmolLM, Mistral, Qwen2).

One flat dataclass; `from_hf` reads a Hugging Face `config.json` dict and `from_gguf` reads
llama.cpp metadata, so the model code never looks at either format.

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

# HF model_type / GGUF general.architecture values this engine runs.
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "smollm", "smollm3")

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
    # field -> the key the user wrote (config.json or GGUF), for messages; the field name if absent
    source_keys: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def key(self, name: str) -> str:
        return self.source_keys.get(name, name)

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
        }

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
                if part not in want:
                    continue
                if i >= self.num_layers:
                    raise ValueError(
                        f"tensor {show(short)!r} belongs to layer {i}, but "
                        f"{self.key('num_layers')}={self.num_layers}"
                    )
                layers.setdefault(i, set()).add(part)
            elif short not in _GLOBAL_WEIGHTS:
                continue
            else:
                part = short
            expected = want[part]
            if tuple(shape) != tuple(d for d, _ in expected):
                raise ValueError(
                    f"tensor {show(short)!r} has shape {list(shape)}, expected "
                    f"{[d for d, _ in expected]} = [{', '.join(why for _, why in expected)}]"
                )
        for name in ("embed_tokens.weight", "norm.weight"):
            if name not in present:
                raise ValueError(f"the checkpoint lacks weight {show(name)!r}")
        per_layer = [n for n in want if n not in _GLOBAL_WEIGHTS]
        biases = [n for n in per_layer if n.endswith(".bias")]
        required = [n for n in per_layer if n not in biases] + (biases if self.attention_bias else [])
        for i in range(self.num_layers):  # stops at the first gap: at most len(shapes) rounds
            have = layers.get(i, set())
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
        arch = d.get("model_type", "llama")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"model_type {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )

        def need(key: str) -> Any:
            if d.get(key) is None:
                raise ValueError(f"config.json lacks {key!r}")
            return d[key]

        # transformers >= 5 folds rope_theta/rope_scaling into `rope_parameters`.
        rope = d.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise _bad("rope_parameters", rope, "a mapping")
        rope = dict(rope)
        theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
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
            "rope_theta": "rope_theta" if "rope_theta" in d else "rope_parameters.rope_theta",
            "rope_scaling": "rope_scaling" if d.get("rope_scaling") else "rope_parameters",
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
        return cls(
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=n_heads,
            num_kv_heads=n_kv,
            head_dim=head_dim,
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=theta,
            rope_scaling=dict(scaling) if isinstance(scaling, dict) else scaling,
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", arch == "qwen2")),
            architecture=arch,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            source_keys=keys,
        )

    @classmethod
    def from_gguf(cls, meta: dict[str, Any], has_output_weight: bool, has_qkv_bias: bool) -> ModelConfig:
        arch = meta.get("general.architecture")
        if not isinstance(arch, str) or arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"GGUF architecture {_show(arch)} (general.architecture) is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
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
            architecture=arch,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=[] if eos is None else [eos],
            source_keys=keys,
        )
