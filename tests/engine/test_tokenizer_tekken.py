"""Mistral's Tekken loads from a Hugging Face folder that ships ``tekken.json`` instead of
tokenizer.json, and a bad Tekken file is refused naming the field. (The real Tekken file,
mistral-common's, is checked against tiktoken in tests/constraints/test_vocab_tekken.py; a small
Tekken file keeps the tiny model here small.)"""

from __future__ import annotations

import json

import pytest

from deepinfer.loader import load_model
from deepinfer.tokenizer import TEKKEN_DEFAULT_SPECIALS, Tokenizer, tekken_tokenizer
from tests.constraints.vocabs import force

from .conftest import TINY, write_hf_folder


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Tokenizer loaded from a tiny HF folder with tekken.json and no tokenizer.json."""
    data = tiny_tekken()
    d = {**TINY, "vocab_size": data["config"]["default_vocab_size"], "bos_token_id": 1, "eos_token_id": 2}
    model = RandomLlama(d)
    folder = write_hf_folder(tmp_path_factory.mktemp("tekken"), model, d, None, tokenizer=False)
    with open(f"{folder}/tekken.json", "w") as fh:
        json.dump(data, fh)
    return Tokenizer.from_loaded(load_model(folder))


class RandomLlama:
    """Random weights under a Llama config's HF names (what write_hf_folder saves)."""

    def __init__(self, d: dict):
        import torch

        g = torch.Generator().manual_seed(0)
        h, f, hd = d["hidden_size"], d["intermediate_size"], d["head_dim"]
        q, kv = d["num_attention_heads"] * hd, d["num_key_value_heads"] * hd
        shapes = {"model.embed_tokens.weight": (d["vocab_size"], h), "model.norm.weight": (h,)}
        shapes["lm_head.weight"] = (d["vocab_size"], h)
        for i in range(d["num_hidden_layers"]):
            at = f"model.layers.{i}."
            shapes |= {at + "input_layernorm.weight": (h,), at + "post_attention_layernorm.weight": (h,)}
            shapes |= {at + f"self_attn.{n}_proj.weight": (o, h) for n, o in (("q", q), ("k", kv), ("v", kv))}
            shapes |= {at + "self_attn.o_proj.weight": (h, q), at + "mlp.down_proj.weight": (h, f)}
            shapes |= {at + "mlp.gate_proj.weight": (f, h), at + "mlp.up_proj.weight": (f, h)}
        self.weights = {k: torch.randn(v, generator=g) * 0.2 for k, v in shapes.items()}

    def state_dict(self):
        return self.weights


def test_hf_folder_with_tekken_json_loads(loaded):
    tok = loaded
    assert tok.bos_token_id == 1 and tok.eos_token_ids == (2,)
    text = "abc ab é"
    ids = tok.encode(text)
    assert ids == [1, 20 + 257, 20 + 32, 20 + 256, 20 + 32, 20 + 0xC3, 20 + 0xA9]
    assert tok.decode(ids) == text
    vocab = tok.vocabulary()
    assert vocab.token_bytes[:20] == (None,) * 20 and vocab.token_bytes[20 + 257] == b"abc"
    assert [vocab.token_bytes[20 + b] for b in range(256)] == [bytes([b]) for b in range(256)]


def test_constraints_work_on_the_loaded_tekken_vocabulary(loaded):
    from deepinfer.constraints import Compiler

    vocab = loaded.vocabulary()
    compiled = Compiler(vocab).regex(r"\{\"k\": \"[^\"]{0,12}\"\}")
    force(compiled, vocab.encode('{"k": "abc é 日本 😀"}'))


def tiny_tekken(**changes) -> dict:
    """A small Tekken file: the 256 single bytes and two merges, 20 special ids (v3 defaults)."""
    import base64

    spelled = [bytes([b]) for b in range(256)] + [b"ab", b"abc"]
    data = {
        "config": {
            "pattern": r"\s+|\S+",
            "num_vocab_tokens": len(spelled),
            "default_vocab_size": 20 + len(spelled),
            "default_num_special_tokens": 20,
            "version": "v3",
        },
        "vocab": [
            {"rank": r, "token_bytes": base64.b64encode(b).decode(), "token_str": None}
            for r, b in enumerate(spelled)
        ],
    }
    for key, value in changes.items():
        section, _, field = key.partition(".")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    return data


def test_tiny_tekken_builds():
    tok, facts = tekken_tokenizer(tiny_tekken())
    assert facts == {"bos_token_id": 1, "eos_token_ids": [2]}
    assert tok.token_to_id("[INST]") == TEKKEN_DEFAULT_SPECIALS.index("[INST]")
    assert tok.encode("abc ab", add_special_tokens=False).ids == [20 + 257, 20 + 32, 20 + 256]


BAD = [
    ({"config": None}, "config is missing"),
    ({"config.pattern": "(unclosed"}, "config.pattern"),
    ({"config.default_num_special_tokens": 0}, "config.default_num_special_tokens"),
    ({"config.default_vocab_size": 10**6}, "config.default_vocab_size"),
    ({"vocab": {"a": 1}}, "vocab must be a list"),
    (
        {"special_tokens": [{"rank": 0, "token_str": "<s>"}, {"rank": 1, "token_str": "<s>"}]},
        "special_tokens",
    ),
]


@pytest.mark.parametrize("changes, match", BAD, ids=[m for _, m in BAD])
def test_bad_tekken_file_names_the_field(changes, match):
    with pytest.raises(ValueError, match=match) as e:
        tekken_tokenizer(tiny_tekken(**changes), "m/tekken.json")
    assert "m/tekken.json" in str(e.value)


def test_bad_tekken_vocab_entry_names_it():
    data = tiny_tekken()
    data["vocab"][257]["token_bytes"] = data["vocab"][256]["token_bytes"]  # "ab" twice
    with pytest.raises(ValueError, match=r"vocab\[257\]"):
        tekken_tokenizer(data)
    data["vocab"][3]["token_bytes"] = "not base64!"
    with pytest.raises(ValueError, match=r"vocab\[3\].token_bytes"):
        tekken_tokenizer(json.loads(json.dumps(data)))
