"""The GGUF loader trusts nothing in the file: every metadata value, tensor info and shape is
checked against the others before anything is allocated, and a bad one is a `GGUFError` that
names the key, tensor or offset (config.json values likewise, as a ValueError naming the key).

1. one test per class of bad metadata, on tiny GGUF files written here with `gguf.GGUFWriter`;
2. the parser on hand-made headers (truncation, magic, version, value/tensor types, counts);
3. a seeded mutation run over the embedded SmolLM2 GGUF: every mutant is a clear GGUFError or
   a model with finite logits, loaded under an address-space cap so none can exhaust memory.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import struct
import sys
import time

import numpy as np
import pytest
import torch

from deepinfer.config import ModelConfig
from deepinfer.loader import load_model
from deepinfer.loader.gguf_file import GGUFError, GGUFFile

gguf = pytest.importorskip("gguf")
VT = gguf.GGUFValueType

# -- a tiny valid GGUF model -------------------------------------------------------------------

TOKENS = ["<|endoftext|>", "a", "b", "ab", "c", "Ġ", "Ġa", "abc"]
MERGES = ["a b", "Ġ a", "ab c"]
V, H, NH, NKV, HD, FF = len(TOKENS), 8, 2, 1, 4, 16

META: dict[str, tuple] = {  # key -> (value, type[, element type])
    "llama.block_count": (1, VT.UINT32),
    "llama.context_length": (64, VT.UINT32),
    "llama.embedding_length": (H, VT.UINT32),
    "llama.feed_forward_length": (FF, VT.UINT32),
    "llama.attention.head_count": (NH, VT.UINT32),
    "llama.attention.head_count_kv": (NKV, VT.UINT32),
    "llama.rope.freq_base": (10000.0, VT.FLOAT32),
    "llama.attention.layer_norm_rms_epsilon": (1e-5, VT.FLOAT32),
    "llama.vocab_size": (V, VT.UINT32),
    "llama.rope.dimension_count": (HD, VT.UINT32),
    "tokenizer.ggml.model": ("gpt2", VT.STRING),
    "tokenizer.ggml.pre": ("default", VT.STRING),
    "tokenizer.ggml.tokens": (TOKENS, VT.ARRAY, VT.STRING),
    "tokenizer.ggml.merges": (MERGES, VT.ARRAY, VT.STRING),
    "tokenizer.ggml.token_type": ([3] + [1] * (V - 1), VT.ARRAY, VT.INT32),
    "tokenizer.ggml.bos_token_id": (0, VT.UINT32),
    "tokenizer.ggml.eos_token_id": (0, VT.UINT32),
}


def tiny_tensors() -> dict[str, np.ndarray]:
    g = np.random.default_rng(0)

    def rnd(*shape):
        return (g.standard_normal(shape) * 0.2).astype(np.float32)

    return {
        "token_embd.weight": rnd(V, H),
        "output_norm.weight": 1 + rnd(H),
        "blk.0.attn_norm.weight": 1 + rnd(H),
        "blk.0.attn_q.weight": rnd(NH * HD, H),
        "blk.0.attn_k.weight": rnd(NKV * HD, H),
        "blk.0.attn_v.weight": rnd(NKV * HD, H),
        "blk.0.attn_output.weight": rnd(H, NH * HD),
        "blk.0.ffn_norm.weight": 1 + rnd(H),
        "blk.0.ffn_gate.weight": rnd(FF, H),
        "blk.0.ffn_up.weight": rnd(FF, H),
        "blk.0.ffn_down.weight": rnd(H, FF),
    }


def write_tiny(path, meta: dict | None = None, tensors: dict | None = None, arch: str = "llama") -> str:
    """The tiny model with `meta` entries replaced (a value keeps the key's type; a tuple gives
    (value, type[, element type]); None drops the key) and `tensors` replaced (None drops)."""
    kv = dict(META)
    for k, v in (meta or {}).items():
        if v is None:
            kv.pop(k, None)
        elif isinstance(v, tuple):
            kv[k] = v
        else:
            kv[k] = (v, *kv[k][1:])
    ts = tiny_tensors()
    for k, v in (tensors or {}).items():
        if v is None:
            ts.pop(k, None)
        else:
            ts[k] = v
    w = gguf.GGUFWriter(str(path), arch)
    for k, (value, vtype, *sub) in kv.items():
        w.add_key_value(k, value, vtype, sub[0] if sub else None)
    for name, arr in ts.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def logits_of(lm, text: str = "abc a b") -> torch.Tensor:
    """Last-position logits of a short prompt through our Llama forward (float32, CPU)."""
    from deepinfer.models.llama import LlamaModel

    model = LlamaModel(lm.config, lm.weights, dtype=torch.float32, max_len=64)
    ids = lm.tokenizer.encode(text).ids[:16] or [0]
    with torch.no_grad():
        return model.logits([ids])[0][-1:]


def test_tiny_model_is_valid(tmp_path):
    """The base of the unit tests loads and runs: each bad variant below fails for its own reason."""
    lm = load_model(write_tiny(tmp_path / "ok.gguf"))
    assert lm.config.num_heads == NH and lm.config.head_dim == HD and lm.config.vocab_size == V
    assert torch.isfinite(logits_of(lm)).all()


@contextlib.contextmanager
def address_space_cap(extra: int = 8 << 30):
    """Cap this process's address space at its current size + `extra` (Linux; restored after), so
    an allocation the loader failed to refuse is a MemoryError, not an exhausted machine."""
    if not sys.platform.startswith("linux"):
        yield
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as fh:
        vm = int(re.search(r"VmSize:\s+(\d+) kB", fh.read()).group(1)) * 1024
    cap = vm + extra if hard == resource.RLIM_INFINITY else min(vm + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def expect_error(path, *fragments: str) -> str:
    """Loading `path` raises GGUFError whose message holds every fragment (fast, no allocation)."""
    t0 = time.perf_counter()
    with address_space_cap(2 << 30), pytest.raises(GGUFError) as info:
        load_model(str(path))
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    assert time.perf_counter() - t0 < 10
    return msg


# -- 1. one test per class of bad metadata -------------------------------------------------------

BAD_META = [
    # (key, value or (value, type...), what the message must also say); {value: "other.key=v"}
    # sets a second key too
    ("llama.block_count", 0, "expected an integer in [1,"),
    ("llama.attention.head_count", 0, "expected an integer in [1,"),
    ("llama.attention.head_count_kv", 0, "expected an integer in [1,"),
    ("llama.attention.head_count_kv", 3, "not a multiple of"),
    ("llama.embedding_length", 0, "expected an integer in [1,"),
    ("llama.embedding_length", 9, "not divisible by"),
    ("llama.embedding_length", 1 << 30, "llama.rope.dimension_count=4: expected 536870912"),
    (
        "llama.embedding_length",
        {1 << 30: "llama.rope.dimension_count=536870912"},
        "at one bit each",
    ),  # absurd: refused before allocating
    ("llama.embedding_length", {16: "llama.rope.dimension_count=8"}, "token_embd.weight"),  # not the tensors
    ("llama.feed_forward_length", 0, "expected an integer in [1,"),
    ("llama.feed_forward_length", 32, "blk.0.ffn_gate.weight"),
    ("llama.context_length", 0, "expected an integer in [1,"),
    ("llama.context_length", (1 << 40, VT.UINT64), "expected an integer in [1,"),
    ("llama.rope.freq_base", math.nan, "finite number > 1"),
    ("llama.rope.freq_base", math.inf, "finite number > 1"),
    ("llama.rope.freq_base", -10000.0, "finite number > 1"),
    ("llama.rope.freq_base", 0.0, "finite number > 1"),
    ("llama.attention.layer_norm_rms_epsilon", math.nan, "finite number > 0"),
    ("llama.attention.layer_norm_rms_epsilon", -1e-5, "finite number > 0"),
    ("llama.attention.layer_norm_rms_epsilon", 0.0, "finite number > 0"),
    ("llama.attention.layer_norm_rms_epsilon", 3.0, "< 1"),
    ("llama.vocab_size", V + 1, "tokenizer.ggml.tokens has 8 entries"),
    ("llama.vocab_size", 0, "llama.vocab_size=0"),
    ("llama.rope.dimension_count", HD // 2, "partial rotary"),
    ("llama.attention.key_length", {(3, VT.UINT32): "llama.rope.dimension_count=3"}, "even"),
    ("llama.attention.key_length", {(8, VT.UINT32): "llama.rope.dimension_count=8"}, "blk.0.attn_q.weight"),
    ("llama.attention.head_count", ("two", VT.STRING), "expected an integer"),
    ("llama.attention.head_count", ([2, 2], VT.ARRAY, VT.UINT32), "per-layer"),
    ("llama.rope.freq_base", ("fast", VT.STRING), "finite number > 1"),
    ("llama.block_count", None, "lacks llama.block_count"),
    ("llama.embedding_length", None, "lacks llama.embedding_length"),
    ("general.alignment", (0, VT.UINT32), "positive power of two"),
    ("general.alignment", (24, VT.UINT32), "positive power of two"),
    ("general.alignment", (2.0, VT.FLOAT32), "positive power of two"),
    ("tokenizer.ggml.tokens", None, "no tokenizer"),
    ("tokenizer.ggml.tokens", (list(range(V)), VT.ARRAY, VT.INT32), "array of strings"),
    ("tokenizer.ggml.merges", None, "BPE"),
    ("tokenizer.ggml.merges", ([1, 2], VT.ARRAY, VT.INT32), "array of strings"),
    ("tokenizer.ggml.merges", (["ab"], VT.ARRAY, VT.STRING), "tokenizer.ggml.merges[0]"),
    ("tokenizer.ggml.merges", (["a b", "a z"], VT.ARRAY, VT.STRING), "tokenizer.ggml.merges[1]"),
    ("tokenizer.ggml.merges", (["b c"], VT.ARRAY, VT.STRING), "concatenation"),  # "bc" is no token
    ("tokenizer.ggml.token_type", ([1] * (V + 3), VT.ARRAY, VT.INT32), "one per token"),
    ("tokenizer.ggml.model", "bert", "not supported"),  # 'llama': test_tokenizer_sentencepiece.py
    ("tokenizer.ggml.bos_token_id", V, "a token id in [0, 8)"),
    ("tokenizer.ggml.eos_token_id", (1 << 40, VT.UINT64), "a token id in [0, 8)"),
    ("tokenizer.ggml.eot_token_id", (-1, VT.INT32), "a token id in [0, 8)"),
    ("llama.rope.scaling.type", ("yarn", VT.STRING), "not supported"),
]


@pytest.mark.parametrize("key, value, expected", BAD_META, ids=[f"{k}={v!r}"[:60] for k, v, _ in BAD_META])
def test_bad_metadata_names_the_key(tmp_path, key, value, expected):
    meta = {key: value}
    if isinstance(value, dict):
        ((value, other),) = value.items()
        other_key, other_value = other.split("=")
        meta = {key: value, other_key: int(other_value)}
    path = write_tiny(tmp_path / "bad.gguf", meta=meta)
    expect_error(path, key, expected)


def test_rope_scaling_factor_must_be_finite(tmp_path):
    path = write_tiny(
        tmp_path / "bad.gguf",
        meta={
            "llama.rope.scaling.type": ("linear", VT.STRING),
            "llama.rope.scaling.factor": (math.nan, VT.FLOAT32),
        },
    )
    expect_error(path, "llama.rope.scaling.factor", "finite number > 0")


def test_unsupported_architecture_names_the_key(tmp_path):
    expect_error(write_tiny(tmp_path / "bad.gguf", arch="gpt2"), "general.architecture", "'gpt2'")


def test_token_not_utf8(tmp_path):
    path = write_tiny(tmp_path / "bad.gguf")
    data = bytearray(open(path, "rb").read())
    at = data.index(b"\x03\x00\x00\x00\x00\x00\x00\x00abc")  # the last token, "abc"
    data[at + 8] = 0xFF
    open(path, "wb").write(bytes(data))
    expect_error(path, "tokenizer.ggml.tokens[7]", "UTF-8")


BAD_TENSORS = [
    # (tensor, replacement or None to drop, fragments of the message)
    ("token_embd.weight", np.zeros((V + 1, H), np.float32), ["token_embd.weight", "llama.vocab_size=8"]),
    ("blk.0.attn_k.weight", np.zeros((2 * HD, H), np.float32), ["blk.0.attn_k.weight", "head_count_kv=1"]),
    ("blk.0.ffn_down.weight", np.zeros((FF, H), np.float32), ["blk.0.ffn_down.weight", "[8, 16]"]),
    ("output_norm.weight", np.ones((H, 1), np.float32), ["output_norm.weight"]),
    ("blk.0.ffn_up.weight", None, ["lacks weight 'blk.0.ffn_up.weight'"]),
    ("token_embd.weight", None, ["lacks weight 'token_embd.weight'"]),
    ("blk.1.ffn_up.weight", np.zeros((FF, H), np.float32), ["blk.1.ffn_up.weight", "llama.block_count=1"]),
    ("blk.0.attn_q.bias", np.zeros(NH * HD, np.float32), ["blk.0.attn_k.bias"]),  # bias on q only
    ("blk.0.ffn_gate.weight", np.full((FF, H), np.nan, np.float32), ["blk.0.ffn_gate.weight", "not finite"]),
    ("rope_freqs.weight", np.zeros(HD // 2, np.float32), ["rope_freqs.weight", "not > 0"]),
]


@pytest.mark.parametrize(
    "name, arr, fragments", BAD_TENSORS, ids=[f"{n}-{i}" for i, (n, *_) in enumerate(BAD_TENSORS)]
)
def test_bad_tensor_names_the_tensor(tmp_path, name, arr, fragments):
    expect_error(write_tiny(tmp_path / "bad.gguf", tensors={name: arr}), *fragments)


def test_quantized_row_must_fill_whole_blocks(tmp_path):
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("x", np.zeros((2, 18), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert GGUFFile(path).tensors["x"].shape == (2, 32)  # valid: 32 values a row = one block
    data = bytearray(path.read_bytes())
    at = data.index(struct.pack("<Q", 1) + b"x") + 9 + 4  # name "x", n_dims, then ne[0]
    data[at : at + 8] = struct.pack("<Q", 16)
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=r"tensor 'x' has type Q4_0.*ne\[0\]=16"):
        GGUFFile(path)


# -- config.json gets the same value checks (ValueError naming the config.json key) ---------------

HF_BAD = [
    ("num_attention_heads", 0, "expected an integer in [1,"),
    ("num_key_value_heads", 3, "not a multiple of"),
    ("num_hidden_layers", 0, "expected an integer in [1,"),
    ("hidden_size", "64", "hidden_size='64'"),
    ("rope_theta", math.nan, "finite number > 1"),
    ("rms_norm_eps", -1e-6, "finite number > 0"),
    ("head_dim", 7, "even"),
    ("max_position_embeddings", 0, "expected an integer in [1,"),
    ("vocab_size", None, "lacks 'vocab_size'"),
    ("bos_token_id", 49152, "token id in [0, 49152)"),
    ("eos_token_id", [2, -1], "token id in [0, 49152)"),
    ("rope_scaling", {"rope_type": "linear", "factor": math.inf}, "rope_scaling.factor"),
]


@pytest.mark.parametrize("key, value, expected", HF_BAD, ids=[k for k, *_ in HF_BAD])
def test_bad_config_json_names_the_key(key, value, expected):
    from .conftest import tiny_config

    d = tiny_config("llama-gqa-untied")
    if value is None:
        d.pop(key)
    else:
        d[key] = value
    with pytest.raises(ValueError) as info:
        ModelConfig.from_hf(d)
    assert key in str(info.value) and expected in str(info.value), str(info.value)


def test_config_json_and_weights_checked_before_loading(tmp_path, smollm_tokenizer):
    from .conftest import tiny_hf_model, write_hf_folder

    model, d = tiny_hf_model("llama-gqa-untied")
    folder = write_hf_folder(tmp_path / "m", model, d, smollm_tokenizer)
    cfg = os.path.join(folder, "config.json")
    good = dict(d)
    json.dump({**good, "rope_theta": float("nan")}, open(cfg, "w"))
    with pytest.raises(ValueError, match=r"config\.json.*rope_theta=nan"):
        load_model(folder)
    json.dump({**good, "intermediate_size": 128}, open(cfg, "w"))
    with pytest.raises(
        ValueError, match=r"layers\.0\.mlp\.(gate|up|down)_proj\.weight.*intermediate_size=128"
    ):
        load_model(folder)
    json.dump({**good, "num_hidden_layers": 3}, open(cfg, "w"))
    with pytest.raises(ValueError, match=r"lacks weight 'layers\.2\..*num_hidden_layers=3"):
        load_model(folder)
    json.dump(good, open(cfg, "w"))
    assert load_model(folder).config.num_layers == 2


def test_model_config_constructor_checks_values():
    base = dict(vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    assert ModelConfig(**base, head_dim=4).head_dim == 4
    with pytest.raises(ValueError, match=r"^num_heads=0: expected"):
        ModelConfig(**{**base, "num_heads": 0}, head_dim=4)
    with pytest.raises(ValueError, match=r"^rope_theta=nan"):
        ModelConfig(**base, head_dim=4, rope_theta=math.nan)
    with pytest.raises(ValueError, match=r"^my\.key=True: expected an integer"):
        ModelConfig(**{**base, "num_layers": True}, head_dim=4, source_keys={"num_layers": "my.key"})


# -- 2. the parser on hand-made headers --------------------------------------------------------


def _s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def _kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + payload


def _info(name: str, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    return (
        _s(name)
        + struct.pack("<I", len(dims))
        + b"".join(struct.pack("<Q", d) for d in dims)
        + struct.pack("<I", ggml_type)
        + struct.pack("<Q", offset)
    )


def _file(tmp_path, kvs=(), infos=(), data=b"", n_kv=None, n_tensors=None, version=3) -> str:
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)  # fmt: skip
    body = head + b"".join(kvs) + b"".join(infos)
    body += b"\0" * (-len(body) % 32) + data
    path = tmp_path / "h.gguf"
    path.write_bytes(body)
    return str(path)


def parse_error(path) -> str:
    t0 = time.perf_counter()
    with address_space_cap(1 << 30), pytest.raises(GGUFError) as info:
        GGUFFile(path)
    assert time.perf_counter() - t0 < 2
    return str(info.value)


def test_parser_accepts_the_hand_made_file(tmp_path):
    f = GGUFFile(_file(tmp_path, [_kv("a.b", 4, struct.pack("<I", 7))], [_info("t", [4])], b"\0" * 16))
    assert f.metadata == {"a.b": 7} and f.tensors["t"].shape == (4,) and f.tensors["t"].nbytes == 16
    f.close()


U32 = struct.pack("<I", 1)

PARSE_CASES = [
    # (description, file arguments, fragments of the message)
    ("bad magic", None, ["not a GGUF file", "magic"]),
    ("version 1", dict(version=1), ["unsupported GGUF version 1", "offset 4"]),
    ("big endian", dict(version=3 << 24), ["big-endian"]),
    ("2**60 metadata entries", dict(n_kv=1 << 60), ["1152921504606846976 metadata entries"]),
    ("2**60 tensors", dict(n_tensors=1 << 60), ["1152921504606846976 tensors"]),
    ("unknown value type", dict(kvs=[_kv("x.y", 99, U32)]), ["'x.y'", "unknown value type 99", "offset"]),
    ("unknown array type", dict(kvs=[_kv("x.y", 9, struct.pack("<IQ", 77, 1) + U32)]), ["'x.y'", "type 77"]),
    ("nested array", dict(kvs=[_kv("x.y", 9, struct.pack("<IQ", 9, 1) + U32)]), ["'x.y'", "array of arrays"]),
    (
        "2**60 u32s",
        dict(kvs=[_kv("x.y", 9, struct.pack("<IQ", 4, 1 << 60))]),
        ["'x.y'", "truncated", "offset"],
    ),
    ("2**60 strings", dict(kvs=[_kv("x.y", 9, struct.pack("<IQ", 8, 1 << 60))]), ["'x.y'", "claims"]),
    ("string 2**62 long", dict(kvs=[_kv("x.y", 8, struct.pack("<Q", 1 << 62))]), ["'x.y'", "offset 47"]),
    ("key 2**62 long", dict(kvs=[struct.pack("<Q", 1 << 62) + b"k" * 16]), ["metadata key #0", "offset"]),
    ("key not UTF-8", dict(kvs=[_kv(b"x\xff", 4, U32)]), ["metadata key #0", "UTF-8", "offset 24"]),
    ("duplicate key", dict(kvs=[_kv("x.y", 4, U32), _kv("x.y", 4, U32)]), ["'x.y' appears twice"]),
    (
        "unknown tensor type",
        dict(infos=[_info("t", [4], 99)], data=b"\0" * 32),
        ["'t'", "unknown ggml type 99"],
    ),
    ("5 dims", dict(infos=[_info("t", [1] * 5)], data=b"\0" * 32), ["'t'", "n_dims=5"]),
    ("dim 2**63", dict(infos=[_info("t", [1 << 63])]), ["'t'", "too many elements"]),
    ("huge tensor", dict(infos=[_info("t", [1 << 40])], data=b"\0" * 32), ["truncated", "'t'"]),
    (
        "misplaced data",
        dict(infos=[_info("t", [4], 0, 32)], data=b"\0" * 64),
        ["'t'", "data offset 32", "expected 0"],
    ),
    (
        "overlapping data",
        dict(infos=[_info("t", [16]), _info("u", [4], 0, 32)], data=b"\0" * 96),
        ["'u'", "data offset 32", "expected 64 after tensor 't'"],
    ),
    (
        "duplicate tensor",
        dict(infos=[_info("t", [8]), _info("t", [8], 0, 32)], data=b"\0" * 64),
        ["'t' appears twice"],
    ),
]


@pytest.mark.parametrize("what, args, fragments", PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parser_errors_name_key_or_offset(tmp_path, what, args, fragments):
    if args is None:
        path = tmp_path / "h.gguf"
        path.write_bytes(b"GGUG" + b"\0" * 60)
    else:
        path = _file(tmp_path, **args)
    msg = parse_error(path)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"


def test_truncated_anywhere_in_the_header(tmp_path, embedded_gguf_path):
    """Cut inside the fixed header, a key, a value, the token list and the tensor infos."""
    with open(embedded_gguf_path, "rb") as fh:
        head = fh.read(1_800_000)
    for keep in (3, 6, 13, 23, 30, 41, 60, 700, 5_000, 400_000, 1_000_000, 1_785_000):
        path = tmp_path / "cut.gguf"
        path.write_bytes(head[:keep])
        msg = parse_error(path)
        assert "truncated" in msg and "offset" in msg, msg


# -- 3. mutations of the embedded model --------------------------------------------------------

_SCALAR_FMT = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


def header_fields(data: bytes) -> tuple[dict[str, tuple[int, str]], int, int]:
    """({label: (offset, struct format)} of the header's fixed-width fields, end of the metadata,
    end of the header). Labels: version, n_tensors, n_kv; kv:KEY:{keylen,type,value,strlen,etype,
    count} and kv:KEY:elemI:len / kv:KEY:elemI:text (first and a few later strings of arrays);
    t:NAME:{namelen,ndims,dimJ,type,offset} and t:NAME:name (offset of the name's bytes)."""
    f: dict[str, tuple[int, str]] = {"version": (4, "<I"), "n_tensors": (8, "<Q"), "n_kv": (16, "<Q")}
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def take(fmt):
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    for _ in range(n_kv):
        at = pos
        n = take("<Q")
        key = data[pos : pos + n].decode()
        pos += n
        f[f"kv:{key}:keylen"], f[f"kv:{key}:type"] = (at, "<Q"), (pos, "<I")
        vtype = take("<I")
        if vtype in _SCALAR_FMT:
            f[f"kv:{key}:value"] = (pos, _SCALAR_FMT[vtype])
            pos += struct.calcsize(_SCALAR_FMT[vtype])
        elif vtype == 8:
            f[f"kv:{key}:strlen"] = (pos, "<Q")
            pos += 8 + take("<Q")
        else:
            f[f"kv:{key}:etype"] = (pos, "<I")
            etype = take("<I")
            f[f"kv:{key}:count"] = (pos, "<Q")
            count = take("<Q")
            if etype == 8:
                for i in range(count):
                    if i < 3 or i % 997 == 0:
                        f[f"kv:{key}:elem{i}:len"] = (pos, "<Q")
                        f[f"kv:{key}:elem{i}:text"] = (pos + 8, "")
                    pos += 8 + take("<Q")
            else:
                pos += count * struct.calcsize(_SCALAR_FMT[etype])
    kv_end = pos
    for _ in range(n_tensors):
        at = pos
        n = take("<Q")
        name = data[pos : pos + n].decode()
        f[f"t:{name}:namelen"], f[f"t:{name}:name"] = (at, "<Q"), (pos, "")
        pos += n
        f[f"t:{name}:ndims"] = (pos, "<I")
        for j in range(take("<I")):
            f[f"t:{name}:dim{j}"] = (pos, "<Q")
            pos += 8
        f[f"t:{name}:type"], f[f"t:{name}:offset"] = (pos, "<I"), (pos + 4, "<Q")
        pos += 12
    return f, kv_end, pos


def make_mutations(
    data: bytes, seed: int = 20240229
) -> list[tuple[str, list[tuple[int, bytes]], bytes | None]]:
    """A fixed, seeded list of (description, byte patches, inserted metadata entry or None)."""
    rng = random.Random(seed)
    f, _, _ = header_fields(data)
    muts = []

    def put(label: str, value, what: str | None = None):
        at, fmt = f[label]
        muts.append((f"{what or label}={value!r}", [(at, struct.pack(fmt, value))], None))

    def text(label: str, old: bytes, new: bytes):
        at = f[label][0]
        at = data.index(old, at, at + 4096)
        muts.append((f"{label}: {old!r}->{new!r}", [(at, new)], None))

    def insert(key: str, vtype: int, payload: bytes):
        kv = _s(key) + struct.pack("<I", vtype) + payload
        muts.append((f"insert {key} type {vtype} {payload.hex()}", [], kv))

    # the fixed header
    put("version", 4)
    for v in (0, 1 << 60):
        put("n_tensors", v)
    for v in (0, 1 << 60):
        put("n_kv", v)
    # model hyper-parameters: bad, absurd and harmless values
    for key, values in {
        "llama.block_count": (0, 29, 31),
        "llama.attention.head_count": (0, 3, 7),
        "llama.attention.head_count_kv": (0, 2),
        "llama.embedding_length": (0, 1152, 0xFFFFFFFF),
        "llama.feed_forward_length": (0, 1535),
        "llama.context_length": (0, 128),
        "llama.vocab_size": (49153,),
        "llama.rope.dimension_count": (32,),
        "tokenizer.ggml.bos_token_id": (49152,),
    }.items():
        for v in values:
            put(f"kv:{key}:value", v)
    for key, values in {
        "llama.rope.freq_base": (math.nan, 0.5, 50000.0),
        "llama.attention.layer_norm_rms_epsilon": (-1e-5, 2.0, 1e-6),
    }.items():
        for v in values:
            put(f"kv:{key}:value", v)
    # value types, key/string lengths, array element types and counts
    put("kv:llama.block_count:type", 5)  # u32 -> i32: same value, harmless
    put("kv:llama.block_count:type", 6)  # -> float32
    put("kv:llama.block_count:type", 13)
    put("kv:general.name:type", 4)
    put("kv:llama.rope.freq_base:type", 4)  # -> u32 (a huge theta: garbage-in but finite)
    put("kv:general.name:keylen", 13)
    put("kv:general.name:keylen", 1 << 62)
    put("kv:general.name:strlen", 2)
    put("kv:tokenizer.chat_template:strlen", 1 << 40)
    put("kv:tokenizer.ggml.tokens:count", 49151)
    put("kv:tokenizer.ggml.tokens:count", 1 << 60)
    put("kv:tokenizer.ggml.tokens:etype", 4)
    put("kv:tokenizer.ggml.merges:count", 1 << 60)
    put("kv:tokenizer.ggml.merges:etype", 9)
    put("kv:tokenizer.ggml.token_type:count", 49153)
    put("kv:tokenizer.ggml.tokens:elem1:len", 1 << 50)
    # strings rewritten in place
    text("kv:tokenizer.ggml.merges:keylen", b"merges", b"merfes")  # no merges
    text("kv:tokenizer.ggml.tokens:keylen", b"tokens", b"tokenz")  # no tokens
    text("kv:tokenizer.ggml.model:strlen", b"gpt2", b"gpt3")
    text("kv:tokenizer.chat_template:strlen", b"message", b"massage")  # harmless
    text("kv:tokenizer.ggml.merges:elem0:len", "Ġ t".encode(), "Ġ!t".encode())  # no space
    text("kv:tokenizer.ggml.merges:elem2:len", b"i n", b"\x01 n")  # a part not in the vocabulary
    text("kv:tokenizer.ggml.tokens:elem1:len", b"<|im_start|>", b"<|im_stArt|>")  # harmless
    label = rng.choice([k for k in f if k.startswith("kv:tokenizer.ggml.tokens:elem") and k.endswith("text")])
    at = f[label][0]
    muts.append((f"{label}: a byte -> 0xff", [(at, b"\xff")], None))  # not UTF-8
    # inserted entries: alignment (bad and harmless), a duplicate key
    for v in (3, 64, 1 << 31):
        insert("general.alignment", 4, struct.pack("<I", v))
    insert("llama.block_count", 4, struct.pack("<I", 30))
    # tensor infos of seeded tensors
    names = [k[2:-6] for k in f if k.startswith("t:") and k.endswith(":ndims")]
    two_d = [n for n in names if f"t:{n}:dim1" in f]
    for n in rng.sample(two_d, 2):
        put(f"t:{n}:dim0", rng.choice([32, 64, 1 << 40, (1 << 63) + 5, 0]), what=f"{n} ne[0]")
        put(f"t:{n}:dim1", rng.choice([1, 2, 1 << 20]), what=f"{n} ne[1]")
    down = "blk.7.ffn_down.weight"
    d0, d1 = (struct.unpack_from("<Q", data, f[f"t:{down}:dim{j}"][0])[0] for j in (0, 1))
    muts.append((f"{down} dims swapped", [(f[f"t:{down}:dim0"][0], struct.pack("<QQ", d1, d0))], None))
    for n in rng.sample(names, 2):
        now = struct.unpack_from("<I", data, f[f"t:{n}:ndims"][0])[0]
        put(f"t:{n}:ndims", rng.choice([v for v in (0, 1, 2, 3, 5, 1 << 31) if v != now]), what=f"{n} n_dims")
    for n, t in zip(rng.sample(names, 3), (0, 8, 4)):
        put(f"t:{n}:type", t, what=f"{n} type")
    put("t:output_norm.weight:type", 1, what="output_norm.weight (the last tensor, F32) type")
    put("t:blk.3.attn_q.weight:type", 99)
    for n, delta in zip(rng.sample(names, 2), (-32, 1 << 62)):
        at = f[f"t:{n}:offset"][0]
        old = struct.unpack_from("<Q", data, at)[0]
        put(f"t:{n}:offset", (old + delta) % (1 << 64), what=f"{n} offset{delta:+}")
    put("t:token_embd.weight:namelen", 1 << 62)
    put("t:blk.2.attn_v.weight:namelen", 20)
    text("t:blk.12.attn_k.weight:namelen", b"blk.12.attn_k", b"blk.12.attn_x")  # missing
    text("t:blk.10.ffn_up.weight:namelen", b"blk.10.", b"blk.40.")  # a layer past block_count
    text("t:blk.1.ffn_up.weight:namelen", b"blk.1.", b"blk.2.")  # a duplicate
    # a few seeded byte flips anywhere in the metadata and tensor infos
    end = header_fields(data)[2]
    for _ in range(4):
        at, bit = rng.randrange(24, end), 1 << rng.randrange(8)
        muts.append((f"byte {at} ^= {bit:#04x}", [(at, bytes([data[at] ^ bit]))], None))
    return muts


def write_inserted(path, data: bytes, ends: tuple[int, int], entry: bytes) -> None:
    """The model with one more metadata entry; the tensor data moves to the next boundary."""
    kv_end, header_end = ends
    data_start = header_end + (-header_end % 32)
    head = bytearray(data[:kv_end]) + entry + data[kv_end:header_end]
    head[16:24] = struct.pack("<Q", struct.unpack_from("<Q", data, 16)[0] + 1)
    m = re.search(rb"general\.alignment\x04\x00\x00\x00(....)", entry, re.S)
    align = struct.unpack("<I", m.group(1))[0] if m else 32
    align = align if 0 < align <= 4096 and not align & (align - 1) else 32
    with open(path, "wb") as out:
        out.write(head + b"\0" * (-len(head) % align))
        out.write(memoryview(data)[data_start:])


@contextlib.contextmanager
def patched(path, data: bytes, patches):
    """The file at `path` (a copy of `data`) with `patches` written in place, then restored."""
    with open(path, "r+b") as fh:
        for at, new in patches:
            fh.seek(at)
            fh.write(new)
    try:
        yield path
    finally:
        with open(path, "r+b") as fh:
            for at, new in patches:
                fh.seek(at)
                fh.write(data[at : at + len(new)])


def run_mutations(
    mutations, base, data: bytes, ends: tuple[int, int], outcomes: dict[str, list[str]]
) -> None:
    """Load each mutant (patched into `base` in place, or written beside it with an inserted
    entry) under the address-space cap, and file the outcome under error / finite / crash."""
    for what, patches, entry in mutations:
        path = base.with_name("inserted.gguf") if entry else base
        if entry:
            write_inserted(path, data, ends, entry)
        t0 = time.perf_counter()
        try:
            with patched(base, data, patches), address_space_cap(8 << 30):
                try:
                    lm = load_model(str(path))
                except GGUFError as e:
                    assert str(e), what
                    outcomes["error"].append(f"{what}: {e}")
                    continue
                logits = logits_of(lm, "Hello, world! 123")
                del lm
            finite = bool(torch.isfinite(logits).all())
            outcomes["finite" if finite else "crash"].append(what + ("" if finite else ": non-finite logits"))
        except Exception as e:  # anything but GGUFError: the loader let a bad file through
            outcomes["crash"].append(f"{what}: {type(e).__name__}: {e}")
        finally:
            assert time.perf_counter() - t0 < 30, what


@pytest.mark.slow
def test_mutated_embedded_model_fails_clearly_or_runs(tmp_path, embedded_gguf_path):
    """80 seeded mutations of the real model's header: each is a GGUFError, or loads and gives
    finite logits; none raises anything else, takes long, or allocates past an 8 GiB cap."""
    with open(embedded_gguf_path, "rb") as fh:
        data = fh.read()
    _, kv_end, header_end = header_fields(data)
    mutations = make_mutations(data)
    assert 60 <= len(mutations) <= 80
    outcomes: dict[str, list[str]] = {"error": [], "finite": [], "crash": []}
    base = tmp_path / "mutant.gguf"
    base.write_bytes(data)  # patched in place (and restored) for each mutation: no 90 MB rewrite
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steadier than 2 on a busy 2-core machine, and the runs are small
    t_all = time.perf_counter()
    try:
        run_mutations(mutations, base, data, (kv_end, header_end), outcomes)
    finally:
        torch.set_num_threads(threads)

    elapsed = time.perf_counter() - t_all
    summary = {k: len(v) for k, v in outcomes.items()}
    print(f"\n{len(mutations)} mutations in {elapsed:.1f} s: {summary}")
    for line in outcomes["finite"]:
        print("  loads:", line)
    assert not outcomes["crash"], "\n".join(outcomes["crash"])
    assert summary["error"] >= len(mutations) // 2 and summary["finite"] >= 5, summary
