"""SentencePiece vocabularies (Llama 2 / Mistral v1 style: ``▁`` for a space, ``<0xNN>`` byte
fallback) as the constraint compiler sees them, from a Hugging Face tokenizer.json.

The tokenizer is mistral-common's ``tokenizer.model.v1`` (Apache-2.0; 32,000 pieces, the Llama 2
layout), turned into tokenizer.json by transformers' SentencePiece converter; the ``sentencepiece``
library is the oracle.

- every token's bytes are what sentencepiece decodes it to (bytes for byte pieces, ``▁`` as a
  space, no bytes for control tokens);
- text in the middle of a sequence is encoded without the dummy prefix;
- completeness: valid JSON and other strings (non-ASCII, emoji that only byte fallback spells),
  tokenised by the tokenizer and byte by byte, are in the masks at every step, and decode back.
"""

from __future__ import annotations

import json

import pytest

from deepinfer.constraints import Compiler, Vocabulary

from .vocabs import force, mistral_common_file, sentencepiece_bytes

sentencepiece = pytest.importorskip("sentencepiece", reason="the sentencepiece library is the test oracle")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """(sentencepiece processor, tokenizers.Tokenizer read from tokenizer.json, Vocabulary)."""
    path = mistral_common_file("tokenizer.model.v1")
    convert = pytest.importorskip("transformers.convert_slow_tokenizer")
    from tokenizers import AddedToken, Tokenizer

    proto = convert.import_protobuf().ModelProto()
    with open(path, "rb") as fh:
        proto.ParseFromString(fh.read())
    hf = convert.SpmConverter.build_tokenizer_from_spm_proto(
        proto, {p.piece: i for i, p in enumerate(proto.pieces)}
    )
    # control and unknown pieces are special tokens, as transformers' LlamaTokenizer adds them
    hf.add_special_tokens([AddedToken(p.piece, special=True) for p in proto.pieces if p.type in (2, 3)])
    file = tmp_path_factory.mktemp("llama2-style") / "tokenizer.json"
    hf.save(str(file))
    tok = Tokenizer.from_file(str(file))
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    return sp, tok, Vocabulary.from_tokenizer(tok)


def test_every_token_has_the_bytes_sentencepiece_decodes(env):
    sp, _, vocab = env
    expected = sentencepiece_bytes(sp)
    assert vocab.vocab_size == len(expected) == 32000
    wrong = [
        (i, sp.id_to_piece(i), vocab.token_bytes[i], b)
        for i, b in enumerate(expected)
        if vocab.token_bytes[i] != b
    ]
    assert not wrong, wrong[:10]
    assert vocab.token_bytes[sp.piece_to_id("<0x0A>")] == b"\n"
    assert vocab.token_bytes[sp.piece_to_id("▁{")] == b" {"
    assert {sp.bos_id(), sp.eos_id(), sp.unk_id()} <= vocab.special_ids
    assert vocab.eos_ids == (sp.eos_id(),)


def test_byte_pieces_spell_utf8_as_sentencepiece_decodes_it(env):
    sp, _, vocab = env
    for text in ["é", "日本", "😀", "🦙", "\x00\x7f", "ÿ\U0010ffff"]:
        ids = [sp.piece_to_id(f"<0x{b:02X}>") for b in text.encode()]
        assert sp.decode(ids) == text
        assert b"".join(vocab.token_bytes[i] for i in ids) == text.encode()


TEXTS = ["Hello world", "two  spaces ", "é 日本 😀 🦙", '{"a": [1, 2.5]}', "\n\ttab", "ied 4 ½ months"]


@pytest.mark.parametrize("text", TEXTS)
def test_text_in_a_sequence_is_encoded_without_the_dummy_prefix(env, text):
    _, tok, vocab = env
    # a whole text is prefixed with "▁": it encodes as a continuation that starts with a space
    assert vocab.encode(" " + text) == tok.encode(text, add_special_tokens=False).ids
    ids = vocab.encode(text)
    assert b"".join(vocab.token_bytes[i] for i in ids) == text.encode()
    assert tok.decode(ids) == text


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "n": {"type": "number"},
        "ok": {"type": ["boolean", "null"]},
    },
    "required": ["name"],
}
INSTANCES = [
    {"name": "Ann"},
    {"name": "é 日本 😀 🦙", "tags": ["  two  spaces ", 'quote " \\ \n'], "n": -12.5e3, "ok": None},
    {"name": "", "tags": [], "n": 0, "ok": True},
]


@pytest.mark.parametrize("indent", [None, 2], ids=["compact", "pretty"])
def test_valid_json_tokenised_and_byte_by_byte_is_always_in_the_mask(env, indent):
    _, tok, vocab = env
    compiler = Compiler(vocab)
    compiled = compiler.json_schema(SCHEMA, whitespace="flexible" if indent else "compact")
    byte_id = {
        vocab.token_bytes[i][0]: i for i in range(vocab.vocab_size) if tok.id_to_token(i).startswith("<0x")
    }
    assert len(byte_id) == 256
    for x in INSTANCES:
        text = json.dumps(x, ensure_ascii=False, indent=indent, separators=None if indent else (",", ":"))
        ids = vocab.encode(text)
        force(compiled, ids)
        assert tok.decode(ids) == text
        by_byte = [byte_id[b] for b in text.encode()]
        force(compiled, by_byte)
        assert tok.decode(by_byte) == text


@pytest.mark.parametrize("text", ["naïve café", "日本語のテキスト", "emoji 😀🦙 end", "a  b\tc"])
def test_other_strings_are_in_the_mask(env, text):
    _, tok, vocab = env
    compiled = Compiler(vocab).regex(r"[^\x00-\x08]{1,40}")
    ids = vocab.encode(text)
    force(compiled, ids)
    assert tok.decode(ids) == text
    exact = Compiler(vocab).choice([text])
    force(exact, ids)
