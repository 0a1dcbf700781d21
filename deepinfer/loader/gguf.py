"""Load a llama.cpp GGUF file: config, weights in HF names/layout (dequantized, or quantized
matrices kept in their blocks: ``keep_blocks``), tokenizer."""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any

import numpy as np
import torch

from ..config import ModelConfig
from .gguf_blocks import INT4_TYPES, Q4_0, Q4_1, Q8_0, GGUFMatrix, dequantize_blocks
from .gguf_file import GGUFError, GGUFFile, is_int
from .plane_cache import PlaneCache
from .types import LoadedModel

# GGUF tensor name -> HF name ({i} is the layer).
_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
# Gemma 2/3 (sandwich norms): llama.cpp's ffn_norm is the pre-MLP norm, and two more norms follow
_GEMMA_NAMES = {
    **_NAMES,
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
    "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.post_feedforward_layernorm.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")

# Pre-tokenizer regexes by `tokenizer.ggml.pre` (llama.cpp's llama-vocab.cpp).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "codeshell", "smaug-bpe")


def _names(sandwich: bool) -> dict[str, str]:
    return _GEMMA_NAMES if sandwich else _NAMES


def hf_name(gguf_name: str, sandwich: bool = False) -> str | None:
    """The HF name of a GGUF tensor (None: not read); ``sandwich``: a family with the extra
    norms (Gemma)."""
    names = _names(sandwich)
    m = _LAYER_RE.match(gguf_name)
    if m:
        tmpl = names.get("blk.{i}." + m.group(2))
        return tmpl.format(i=m.group(1)) if tmpl else None
    return names.get(gguf_name)


def gguf_name(short_hf_name: str, sandwich: bool = False) -> str:
    """The GGUF name of an HF weight name without "model." (for messages)."""
    m = re.match(r"^layers\.(\d+)\.(.+)$", short_hf_name)
    for g, h in _names(sandwich).items():
        h = h.removeprefix("model.")
        if m and h == "layers.{i}." + m.group(2):
            return g.format(i=m.group(1))
        if h == short_hf_name:
            return g
    return short_hf_name


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's RoPE row permutation of q/k: back to the HF rotate-half layout.

    w: [out, in] (or a bias [out]); out = n_head * head_dim.
    """
    out, rest = w.shape[0], w.shape[1:]
    return w.reshape(n_head, out // n_head // 2, 2, *rest).transpose(1, 2).reshape(out, *rest)


def dequantize(f: GGUFFile, name: str) -> torch.Tensor:
    """float32 tensor in numpy/HF shape (row-major, [out, in]); GGUFError if a value is not finite."""
    info = f.tensors[name]
    raw = f.raw(name)
    with warnings.catch_warnings():  # the map is read-only; every path below copies
        warnings.simplefilter("ignore", UserWarning)
        fast = dequantize_blocks(torch.from_numpy(raw), info.ggml_type)
    if fast is not None:
        _check_finite(f, name, raw, fast)
        return fast.view(info.shape)
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType(info.ggml_type)
    try:
        arr = quants.dequantize(raw, qtype)
    except NotImplementedError as e:
        raise GGUFError(f"{f.path!r}: tensor {name!r} uses {qtype.name}, which gguf cannot dequantize") from e
    out = torch.from_numpy(np.array(arr, dtype=np.float32).reshape(info.shape))
    _check_finite(f, name, raw, out)
    return out


def _check_finite(f: GGUFFile, name: str, raw: np.ndarray, out: torch.Tensor) -> None:
    """GGUFError unless every value is finite. Q4_0/Q4_1/Q8_0 weights are finite iff their f16
    block scales are (1/32 of the values to check); other types are checked whole."""
    layout = {Q4_0: (18, 2), Q4_1: (20, 4), Q8_0: (34, 2)}.get(f.tensors[name].ggml_type)
    if layout is not None:
        block, head = layout
        ok = bool(np.isfinite(raw.reshape(-1, block)[:, :head].copy().view(np.float16)).all())
    else:
        ok = bool(torch.isfinite(out).all())
    if not ok:
        raise GGUFError(f"{f.path!r}: tensor {name!r} holds values that are not finite (NaN or inf)")


def load_gguf(path: str, *, keep_blocks: bool = False) -> LoadedModel:
    """``keep_blocks``: matrices stored as Q4_0, Q4_1 or Q8_0 come back as `GGUFMatrix` (their
    blocks, read from the file's map, not dequantized; the map stays open while one lives); every
    other tensor is dequantized to float32."""
    f = GGUFFile(path)
    try:
        return _load(f, path, keep_blocks)
    finally:
        f.close()  # (left to the garbage collector while a kept matrix reads the map)


def _kept(f: GGUFFile, name: str, reorder=None) -> GGUFMatrix:
    """Tensor ``name`` (2-d, of an INT4_TYPES type) as its blocks (``reorder``: of its rows, when
    first read); they are checked finite as they are converted (one pass over the file's pages)."""
    info = f.tensors[name]
    with warnings.catch_warnings():  # the map is read-only; nothing writes to these blocks
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.from_numpy(f.raw(name))
    where = f"{f.path!r}: tensor {name!r}"
    return GGUFMatrix(raw, info.ggml_type, info.shape[1], lambda: f.release(name), where, reorder)


def _load(f: GGUFFile, path: str, keep_blocks: bool = False) -> LoadedModel:
    meta = f.metadata
    try:  # every value and shape is checked against the others before anything is dequantized
        config = ModelConfig.from_gguf(
            meta,
            has_output_weight="output.weight" in f.tensors,
            has_qkv_bias="blk.0.attn_q.bias" in f.tensors,
        )
        check_tensors(f, config)
    except GGUFError:
        raise
    except ValueError as e:
        raise GGUFError(f"{path!r}: {e}") from e
    tokenizer, special = build_tokenizer(meta, path)
    weights: dict[str, torch.Tensor | GGUFMatrix] = {}
    permute = config.family.gguf_permute  # llama.cpp permutes q/k rows for llama, mistral, smollm
    sandwich = config.family.sandwich_norms
    for name in f.tensors:
        target = hf_name(name, sandwich)
        if target is None:
            continue
        info = f.tensors[name]
        if keep_blocks and len(info.shape) == 2 and info.ggml_type in INT4_TYPES:
            reorder = None
            if permute and (".attn_q." in name or ".attn_k." in name):
                heads = config.num_heads if ".attn_q." in name else config.num_kv_heads
                reorder = functools.partial(unpermute_qk, n_head=heads)  # (a copy, if ever read)
            weights[target] = _kept(f, name, reorder)
            continue
        w = dequantize(f, name)
        if config.family.norm_offset and target.endswith("norm.weight"):
            w = w - 1.0  # llama.cpp stores Gemma's norm weights with the 1 + added: back to HF's w
        if target == "rope_freqs" and not bool((w > 0).all()):
            raise GGUFError(f"{path!r}: tensor {name!r} holds frequency divisors that are not > 0")
        if permute and (".attn_q." in name or ".attn_k." in name):
            heads = config.num_heads if ".attn_q." in name else config.num_kv_heads
            w = unpermute_qk(w, heads)
        weights[target] = w.contiguous()
    planes = PlaneCache(path) if keep_blocks else None
    return LoadedModel(
        config=config, weights=weights, tokenizer=tokenizer, source=path, planes=planes, **special
    )


def check_tensors(f: GGUFFile, config: ModelConfig) -> None:
    """ValueError unless the file can hold the weights `config` implies and every tensor the
    model reads has the implied shape (named by its GGUF name and the keys behind each size)."""
    size = f.size
    params = config.num_parameters()
    if params / 8 > size:  # no GGML type stores a weight in less than a bit
        k = config.key
        raise ValueError(
            f"{k('hidden_size')}={config.hidden_size}, {k('intermediate_size')}={config.intermediate_size}, "
            f"{k('num_layers')}={config.num_layers} and {k('vocab_size')}={config.vocab_size} imply "
            f"{params:,} parameters, at least {params // 8:,} bytes even at one bit each, but the file "
            f"has {size:,} bytes"
        )
    sandwich = config.family.sandwich_norms
    shapes = {hf_name(n, sandwich): t.shape for n, t in f.tensors.items() if hf_name(n, sandwich) is not None}
    config.check_weights(shapes, lambda short: gguf_name(short, sandwich))


def _tokenizer_meta(meta: dict[str, Any], path: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(tokens, merges) after checking every tokenizer key this loader reads (GGUFError naming it)."""

    def bad(key: str, value: Any, expected: str) -> GGUFError:
        shown = repr(value)[:60]
        if isinstance(value, (list, np.ndarray)):
            shown = f"<{type(value).__name__} of length {len(value)}>"
        return GGUFError(f"{path!r}: {key}={shown}: expected {expected}")

    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None or (isinstance(tokens, list) and not tokens):
        raise GGUFError(f"{path!r} has no tokenizer: GGUF metadata lacks tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise bad("tokenizer.ggml.tokens", tokens, "an array of strings")
    if _not_utf8("".join(tokens)):  # (string arrays are read with surrogateescape)
        i = next(i for i, t in enumerate(tokens) if _not_utf8(t))
        raise GGUFError(f"{path!r}: tokenizer.ggml.tokens[{i}]={tokens[i]!r} is not valid UTF-8")
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise GGUFError(
            f"{path!r}: GGUF tokenizer model {kind!r} (tokenizer.ggml.model) is not supported (only "
            "byte-level BPE 'gpt2' and SentencePiece 'llama'); load the model from a Hugging Face folder "
            "with tokenizer.json instead"
        )
    merges = _bpe_merges(meta, tokens, path, bad) if kind == "gpt2" else []
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and (
        not isinstance(types, np.ndarray) or types.dtype.kind not in "iu" or types.shape != (len(tokens),)
    ):
        raise bad("tokenizer.ggml.token_type", types, f"an integer array of {len(tokens)} (one per token)")
    if kind == "llama":
        _check_sentencepiece_meta(meta, tokens, bad)
    for key, kind_of in (("tokenizer.ggml.pre", str), ("tokenizer.chat_template", str)):
        if key in meta and not isinstance(meta[key], kind_of):
            raise bad(key, meta[key], "a string")
    if "tokenizer.ggml.add_bos_token" in meta and not isinstance(meta["tokenizer.ggml.add_bos_token"], bool):
        raise bad("tokenizer.ggml.add_bos_token", meta["tokenizer.ggml.add_bos_token"], "a bool")
    for name in ("bos", "eos", "eot"):
        key = f"tokenizer.ggml.{name}_token_id"
        v = meta.get(key)
        if v is not None and not (is_int(v) and 0 <= v < len(tokens)):
            raise bad(key, v, f"a token id in [0, {len(tokens)})")
    return tokens, merges


def _bpe_merges(meta: dict[str, Any], tokens: list[str], path: str, bad) -> list[tuple[str, str]]:
    raw_merges = meta.get("tokenizer.ggml.merges")
    if raw_merges is None:
        raise GGUFError(
            f"{path!r}: GGUF metadata lacks tokenizer.ggml.merges, which a BPE ('gpt2') tokenizer needs"
        )
    if not isinstance(raw_merges, list) or not raw_merges or not all(isinstance(m, str) for m in raw_merges):
        raise bad("tokenizer.ggml.merges", raw_merges, "a non-empty array of strings")
    vocab = set(tokens)
    # The checks as string and set operations (C loops; a Python loop over 48k merges took
    # 0.1-0.3 s of a load): when every merge holds one space and no newline, the joined text
    # splits into left, right, left, right, ...; the loop below runs only when that does not
    # hold, to accept the merges a right part with a space makes, or to name the first bad one.
    n = len(raw_merges)
    text = "\n".join(raw_merges)
    if text.count("\n") == n - 1 and text.count(" ") == n and all(" " in m for m in raw_merges):
        halves = text.replace(" ", "\n").split("\n")
        lefts, rights = halves[0::2], halves[1::2]
        joined = text.replace(" ", "").split("\n")
        if vocab.issuperset(lefts) and vocab.issuperset(rights) and vocab.issuperset(joined):
            return list(zip(lefts, rights))
    merges = []
    for j, m in enumerate(raw_merges):
        a, space, b = m.partition(" ")
        if not space or a not in vocab or b not in vocab or a + b not in vocab:
            raise GGUFError(
                f"{path!r}: tokenizer.ggml.merges[{j}]={m!r}: expected two tokens separated by a space, "
                "each and their concatenation in tokenizer.ggml.tokens"
            )
        merges.append((a, b))
    return merges


def _check_sentencepiece_meta(meta: dict[str, Any], tokens: list[str], bad) -> None:
    """The keys a SentencePiece ('llama') tokenizer reads: one finite score and one type per token."""
    n = len(tokens)
    scores = meta.get("tokenizer.ggml.scores")
    if not (isinstance(scores, np.ndarray) and scores.dtype.kind == "f" and scores.shape == (n,)):
        raise bad(
            "tokenizer.ggml.scores", scores, f"a float array of {n} (one per token, SentencePiece needs it)"
        )
    if not np.isfinite(scores).all():
        raise bad("tokenizer.ggml.scores", scores, "finite numbers")
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and not ((types >= 1) & (types <= 6)).all():
        raise bad("tokenizer.ggml.token_type", types, "token types in [1, 6]")
    if "tokenizer.ggml.add_space_prefix" in meta and not isinstance(
        meta["tokenizer.ggml.add_space_prefix"], bool
    ):
        raise bad("tokenizer.ggml.add_space_prefix", meta["tokenizer.ggml.add_space_prefix"], "a bool")
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    if unk is not None and not (is_int(unk) and 0 <= unk < n):
        raise bad("tokenizer.ggml.unknown_token_id", unk, f"a token id in [0, {n})")


def _not_utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def build_tokenizer(meta: dict[str, Any], path: str):
    """A `tokenizers.Tokenizer` from GGUF metadata: byte-level BPE ('gpt2': vocab, merges, token
    types) or SentencePiece ('llama': vocab, scores, token types; `deepinfer.tokenizer`)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tokens, merges = _tokenizer_meta(meta, path)
    if meta.get("tokenizer.ggml.model") == "llama":
        from ..tokenizer import sentencepiece_tokenizer

        tok = sentencepiece_tokenizer(
            tokens,
            meta["tokenizer.ggml.scores"].tolist(),
            meta.get("tokenizer.ggml.token_type"),
            add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
            unk_id=meta.get("tokenizer.ggml.unknown_token_id"),
        )
        return tok, _special_facts(meta)
    vocab = {t: i for i, t in enumerate(tokens)}
    try:
        bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=False)
    except Exception as e:  # (the checks above leave nothing for tokenizers to refuse)
        raise GGUFError(f"{path!r}: tokenizer.ggml.tokens/merges do not make a BPE tokenizer: {e}") from e
    tok = Tokenizer(bpe)
    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLIT_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in ("llama3", "llama-v3", "llama-bpe", "qwen2", "deepseek-r1-qwen"):
        split = _QWEN2_SPLIT if "qwen" in pre else _LLAMA3_SPLIT
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None:
        # 3 = CONTROL (special, never split), 4 = USER_DEFINED (whole, not special)
        control = [AddedToken(tokens[i], special=True, normalized=False) for i in np.flatnonzero(types == 3)]
        user = [AddedToken(tokens[i], special=False, normalized=False) for i in np.flatnonzero(types == 4)]
        tok.add_special_tokens(control)
        if user:
            tok.add_tokens(user)
    return tok, _special_facts(meta)


def _special_facts(meta: dict[str, Any]) -> dict[str, Any]:
    """BOS, EOS (+ EOT), chat template and add-BOS flag for `LoadedModel`."""
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    eos_ids = [int(x) for x in (eos, eot) if x is not None]
    special = {
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_ids": list(dict.fromkeys(eos_ids)),
        "chat_template": meta.get("tokenizer.chat_template"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    }
    return special
