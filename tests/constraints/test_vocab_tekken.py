"""Mistral's Tekken (tiktoken-style byte-level BPE from ``tekken.json``) as the constraint
compiler sees it.

The file is mistral-common's ``tekken_240911.json`` (Apache-2.0; Mistral NeMo's 131,072 ids:
1,000 special, then the byte-level vocabulary); ``tiktoken`` built from the same file is the
oracle, as mistral-common builds it.

- every token's bytes are tiktoken's bytes for its rank; the special ids have none;
- the tokenizer encodes like tiktoken (a piece that is a token stays whole);
- completeness: valid JSON and other strings, tokenised by the tokenizer and byte by byte,
  are in the masks at every step, and decode back.
"""

from __future__ import annotations

import json

import pytest

from deepinfer.constraints import Compiler

from .vocabs import force, tekken


@pytest.fixture(scope="module")
def env():
    return tekken()


def test_every_token_has_tiktokens_bytes(env):
    tok, vocab, oracle, n_special = env
    assert vocab.vocab_size == tok.get_vocab_size() == 131072
    assert all(vocab.token_bytes[i] is None for i in range(n_special))
    wrong = [
        i
        for i in range(n_special, vocab.vocab_size)
        if vocab.token_bytes[i] != oracle.decode_single_token_bytes(i - n_special)
    ]
    assert not wrong, wrong[:10]
    assert vocab.eos_ids == (tok.token_to_id("</s>"),) == (2,)
    assert tok.token_to_id("[INST]") == 3 and tok.token_to_id("<SPECIAL_999>") == 999


TEXTS = [
    "Hello world",
    "  two  spaces\n\n\tand tabs ",
    "é 日本語 😀 🦙 ½",
    '{"a": [1, 2.5e-3, null], "b": "x\\n"}',
    "CamelCaseWords and ALLCAPS, numbers 1234567 and a/b/c paths\r\n",
    "нещо на Български ქართული",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encodes_like_tiktoken(env, text):
    tok, vocab, oracle, n_special = env
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids == [n_special + r for r in oracle.encode(text, disallowed_special=())]
    assert vocab.encode(text) == ids
    assert tok.decode(ids) == text
    assert tok.encode(text).ids == [1, *ids]  # BOS first, as Mistral's models read it


def test_special_token_text_is_no_text(env):
    tok, vocab, *_ = env
    ids = tok.encode("[INST] hi [/INST]", add_special_tokens=False).ids
    assert ids[0] == 3 and ids[-1] == 4
    assert vocab.token_bytes[3] is None and tok.decode(ids) == " hi "


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name"],
}
INSTANCES = [
    {"name": "Ann"},
    {"name": "é 日本 😀 🦙", "tags": ["  two  spaces ", 'quote " \\ \n', "нещо"]},
]


@pytest.mark.parametrize("indent", [None, 2], ids=["compact", "pretty"])
def test_valid_json_tokenised_and_byte_by_byte_is_always_in_the_mask(env, indent):
    tok, vocab, _, n_special = env
    compiled = Compiler(vocab).json_schema(SCHEMA, whitespace="flexible" if indent else "compact")
    for x in INSTANCES:
        text = json.dumps(x, ensure_ascii=False, indent=indent, separators=None if indent else (",", ":"))
        ids = vocab.encode(text)
        force(compiled, ids)
        assert tok.decode(ids) == text
        by_byte = [n_special + b for b in text.encode()]  # ranks 0-255 are the single bytes
        force(compiled, by_byte)
        assert tok.decode(by_byte) == text


@pytest.mark.parametrize("text", ["naïve café", "日本語のテキスト", "emoji 😀🦙 end"])
def test_other_strings_are_in_the_mask(env, text):
    tok, vocab, *_ = env
    ids = vocab.encode(text)
    force(Compiler(vocab).regex(r"[^\x00-\x08]{1,40}"), ids)
    force(Compiler(vocab).choice([text]), ids)
    assert tok.decode(ids) == text
