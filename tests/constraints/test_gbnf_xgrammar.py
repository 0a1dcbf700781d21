"""GBNF cross-checked against an independent implementation: xgrammar's GBNF parser and
matcher (a test dependency).

Soundness: seeded random walks over our token masks (the SmolLM2 vocabulary), closed by
the shortest completion, give texts that xgrammar accepts. Exactness: texts mutated from
them (a character deleted, inserted or replaced) are accepted by ours exactly when xgrammar
accepts them, so the mutants out of the language are rejected by both. Completeness: each
sampled text, tokenized as the tokenizer would and byte by byte, is accepted token by token.
"""

from __future__ import annotations

import collections
import random
from functools import lru_cache

import pytest

from deepinfer import grammars
from deepinfer.constraints import Compiler, Matcher, Vocabulary

from .shared_data import shared_path

xgr = pytest.importorskip("xgrammar")

WALKS = 6
MUTANTS = 6


@lru_cache(maxsize=1)
def smollm2():
    """(tokenizers.Tokenizer, Compiler) of the embedded SmolLM2's vocabulary."""
    from deepinfer.loader import default_gguf_path
    from deepinfer.loader.gguf import build_tokenizer
    from deepinfer.loader.gguf_file import GGUFFile

    try:
        path = default_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    f = GGUFFile(path)
    tok, special = build_tokenizer(f.metadata, path)
    f.close()
    vocab = Vocabulary.from_tokenizer(tok, eos_ids=special.get("eos_token_ids") or [2])
    return tok, Compiler(vocab)


def _grammar_texts() -> list[tuple[str, str | None]]:
    out = [(n, grammars.load(n)) for n in ("person.gbnf", "arithmetic.gbnf")]
    folder = shared_path("gbnf")
    # llama.cpp's files that xgrammar's parser reads (it refuses json.gbnf's empty alternative)
    for name in ("arithmetic", "chess", "list", "japanese", "english", "c"):
        p = folder / f"{name}.gbnf" if folder is not None else None
        out.append((f"llama.cpp/{name}", p.read_text(encoding="utf-8") if p and p.exists() else None))
    return out


GRAMMARS = _grammar_texts()


def _complete(a, cfg, rng: random.Random, max_nodes: int = 20_000) -> bytes | None:
    """Shortest bytes from ``cfg`` to a configuration that may end (BFS, ties random)."""
    if a.can_end(cfg):
        return b""
    seen = {cfg}
    queue = collections.deque([(cfg, b"")])
    while queue and len(seen) < max_nodes:
        c, path = queue.popleft()
        nb = list(a.next_bytes(c))
        rng.shuffle(nb)
        for b in nb:
            n = a.step_byte(c, b)
            if n is None or n in seen:
                continue
            if a.can_end(n):
                return path + bytes([b])
            seen.add(n)
            queue.append((n, path + bytes([b])))
    return None


def _mutants(text: str, rng: random.Random, alphabet: str) -> list[str]:
    """Texts one character away from ``text``: one deleted, inserted or replaced."""
    out = []
    for _ in range(MUTANTS):
        i = rng.randrange(len(text) + 1)
        op = rng.randrange(3)
        if op == 0 and text:
            i = min(i, len(text) - 1)
            out.append(text[:i] + text[i + 1 :])
        elif op == 1:
            out.append(text[:i] + rng.choice(alphabet) + text[i:])
        elif text:
            i = min(i, len(text) - 1)
            out.append(text[:i] + rng.choice(alphabet) + text[i + 1 :])
    return out


@pytest.mark.parametrize("name,text", GRAMMARS, ids=[g[0] for g in GRAMMARS])
def test_random_walks_agree_with_xgrammar(name, text):
    if text is None:
        pytest.skip(f"{name}: shared data not available (set DEEPINFER_SHARED_DATA)")
    tok, compiler = smollm2()
    compiled = compiler.gbnf(text)
    vocab = compiled.vocab
    a = compiled.automaton
    xg = xgr.Grammar.from_ebnf(text)

    def theirs(data: bytes) -> bool:
        return xgr.testing._is_grammar_accept_string(xg, data.decode("utf-8"))

    rng = random.Random(name)
    eos = set(vocab.eos_ids)
    samples = []
    for walk in range(WALKS):
        m = Matcher(compiled)
        out = bytearray()
        for _ in range(rng.randint(1, 12)):
            allowed = [int(t) for t in m.allowed_tokens() if int(t) not in eos]
            if not allowed:
                break
            t = rng.choice(allowed)
            assert m.accept(t)
            out += vocab.token_bytes[t]
        tail = _complete(a, m.state, rng)
        assert tail is not None, (name, walk, bytes(out))
        assert not tail or m.accept_bytes(tail)
        assert m.can_end()
        data = bytes(out) + tail
        data.decode("utf-8")  # (a walk ends on whole characters)
        assert theirs(data), f"{name}: xgrammar rejects our sample {data!r}"
        samples.append(data)
    # mutants: ours and xgrammar's verdicts agree, and some are out of the language
    # the samples' characters, and others (weighted up) that most of the grammars refuse somewhere
    alphabet = "".join(sorted(set(b"".join(samples).decode("utf-8")))) + ' "(){}[]0aZ-+,.\n\x01éひ' * 3
    rejected = 0
    for data in samples:
        for mutant in _mutants(data.decode("utf-8"), rng, alphabet):
            ours = compiled.accepts(mutant.encode("utf-8"))
            assert ours == theirs(mutant.encode("utf-8")), (
                f"{name}: ours {ours}, xgrammar {not ours} on {mutant!r}"
            )
            rejected += not ours
    assert rejected, f"{name}: no mutant fell out of the language"
    # completeness: the tokenizer's own tokens of each sample are accepted one by one, and
    # so are its single-byte tokens, byte by byte
    single = {}
    for i, piece in enumerate(vocab.token_bytes):
        if piece is not None and len(piece) == 1:
            single.setdefault(piece[0], i)
    for data in samples:
        m = Matcher(compiled)
        for t in tok.encode(data.decode("utf-8"), add_special_tokens=False).ids:
            assert m.accept(t), (name, data, vocab.token_bytes[t])
        assert m.can_end(), (name, data)
        m = Matcher(compiled)
        for b in data:
            assert m.accept(single[b]), (name, data, b)
        assert m.can_end(), (name, data)
