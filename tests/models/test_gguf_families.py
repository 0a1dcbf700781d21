"""Qwen3 and Gemma 3 from GGUF files written with gguf.GGUFWriter from transformers' tiny random
weights, as llama.cpp's converter lays them out (qwen3: attn_q_norm / attn_k_norm, q/k rows not
permuted; gemma3: the sandwich norms' names, 1 added to every norm weight, the window in
gemma3.attention.sliding_window, 5 of 6 layers windowed): their logits equal transformers'. A
GGUF architecture without a loader is named with the supported list."""

from __future__ import annotations

import pytest
import torch

from deepinfer.loader import load_model
from deepinfer.loader.gguf import _GEMMA_NAMES, _NAMES
from deepinfer.loader.gguf_file import GGUFError
from deepinfer.models.llama import LlamaModel

from .conftest import BASE, hf_model

gguf = pytest.importorskip("gguf")
VT = gguf.GGUFValueType
TOKENS = ["<|endoftext|>", "a", "b", "ab", "c", "Ġ", "Ġa", "abc"]
MERGES = ["a b", "Ġ a", "ab c"]


def _write(path, hf, arch: str = "qwen3", extra=()) -> str:
    c = hf.config
    gemma = arch == "gemma3"
    w = gguf.GGUFWriter(str(path), arch)
    for key, value, vtype in [
        ("block_count", c.num_hidden_layers, VT.UINT32),
        ("context_length", c.max_position_embeddings, VT.UINT32),
        ("embedding_length", c.hidden_size, VT.UINT32),
        ("feed_forward_length", c.intermediate_size, VT.UINT32),
        ("attention.head_count", c.num_attention_heads, VT.UINT32),
        ("attention.head_count_kv", c.num_key_value_heads, VT.UINT32),
        ("attention.key_length", c.head_dim, VT.UINT32),
        ("attention.value_length", c.head_dim, VT.UINT32),
        ("rope.freq_base", 1e6 if gemma else 10000.0, VT.FLOAT32),
        ("attention.layer_norm_rms_epsilon", c.rms_norm_eps, VT.FLOAT32),
        *extra,
    ]:
        w.add_key_value(f"{arch}.{key}", value, vtype)
    w.add_key_value("tokenizer.ggml.model", "gpt2", VT.STRING)
    w.add_key_value("tokenizer.ggml.tokens", TOKENS, VT.ARRAY, VT.STRING)
    w.add_key_value("tokenizer.ggml.merges", MERGES, VT.ARRAY, VT.STRING)
    to_gguf = {}
    for g, h in (_GEMMA_NAMES if gemma else _NAMES).items():
        for i in range(c.num_hidden_layers):
            to_gguf[h.format(i=i)] = g.format(i=i)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        t = t.detach().float() + (1.0 if gemma and name.endswith("norm.weight") else 0.0)
        w.add_tensor(to_gguf[name], t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_qwen3_gguf_matches_transformers(tmp_path):
    hf = hf_model("qwen3", vocab_size=len(TOKENS))
    lm = load_model(_write(tmp_path / "qwen3.gguf", hf))
    assert lm.config.architecture == "qwen3" and lm.config.head_dim == BASE["head_dim"]
    ours = LlamaModel(lm.config, lm.weights, dtype=torch.float32)
    ids = [[1, 3, 5, 2, 7, 4, 4, 6, 1], [2, 6]]
    for got, p in zip(ours.logits(ids), ids):
        with torch.no_grad():
            want = hf(torch.tensor([p])).logits[0]
        torch.testing.assert_close(got, want, atol=3e-5, rtol=0)


def test_gemma3_gguf_matches_transformers(tmp_path):
    """Six layers (llama.cpp's pattern: layer 5 global), a window of 4 keys, prompts past it."""
    hf = hf_model("gemma3_text", vocab_size=len(TOKENS), num_hidden_layers=6, layer_types=None,
                  query_pre_attn_scalar=BASE["head_dim"], final_logit_softcapping=None,
                  rope_parameters=None)  # fmt: skip
    assert hf.config.layer_types[4:] == ["sliding_attention", "full_attention"]
    path = _write(tmp_path / "gemma3.gguf", hf, "gemma3", [("attention.sliding_window", 4, VT.UINT32)])
    lm = load_model(path)
    assert lm.config.architecture == "gemma3_text" and lm.config.layer_windows == [4, 4, 4, 4, 4, 0]
    ours = LlamaModel(lm.config, lm.weights, dtype=torch.float32)
    ids = [[1, 3, 5, 2, 7, 4, 4, 6, 1, 2, 3], [2, 6]]
    for got, p in zip(ours.logits(ids), ids):
        with torch.no_grad():
            want = hf(torch.tensor([p])).logits[0]
        torch.testing.assert_close(got, want, atol=3e-5, rtol=0)


def test_gguf_architecture_without_a_loader_is_named(tmp_path):
    hf = hf_model("qwen3", vocab_size=len(TOKENS))
    with pytest.raises(GGUFError, match=r"GGUF architecture 'phi3' .* \(supported: .*qwen3, gemma3"):
        load_model(_write(tmp_path / "g.gguf", hf, arch="phi3"))
