"""The vocabulary tries on disk (constraints/tokens/trie_cache.py): a trie loaded from the
cache is the trie built, for random vocabularies and parts; a corrupt or truncated file is
built again, and a folder that cannot be written still gives the trie."""

from __future__ import annotations

import random

import numpy as np
import pytest

from deepinfer.constraints.tokens import trie_cache
from deepinfer.constraints.tokens.trie import VocabIndex
from deepinfer.constraints.vocab import Vocabulary

FIELDS = (*VocabIndex.BASE, "tok_bit", "root_of_byte", "fast_nodes", "max_depth", "n_nodes", "n_words")


def _same(a: VocabIndex, b: VocabIndex) -> None:
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert np.array_equal(x, y), f


def _vocab(seed: int) -> Vocabulary:
    rng = random.Random(seed)
    toks = [bytes(rng.choices(b'ab"\x00\xff{', k=rng.randint(1, 6))) for _ in range(rng.randint(1, 300))]
    toks += [None, b"a", b"a"]  # an absent token and duplicates
    return Vocabulary(toks, eos_ids=[len(toks) - 3], vocab_size=len(toks) + rng.randint(0, 40))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(trie_cache.ENV, raising=False)
    return tmp_path


def test_loaded_trie_is_the_built_trie(cache):
    for seed in range(12):
        v = _vocab(seed)
        for part, keep in (
            ("all", None),
            ("without-22", lambda b: b'"' not in b),
            ("with-22", lambda b: b'"' in b),
        ):
            built = VocabIndex(v, keep=keep)
            first = trie_cache.trie(v, part, keep)  # built, then written
            assert len(list((cache / "tries").glob(f"*-{part}.bin"))) >= 1
            again = trie_cache.trie(v, part, keep)  # loaded
            _same(built, first)
            _same(built, again)


def test_corrupt_files_are_built_again(cache):
    v = _vocab(99)
    built = VocabIndex(v)
    trie_cache.trie(v, "all")
    (path,) = (cache / "tries").glob("*-all.bin")
    data = bytearray(path.read_bytes())
    for damage in ("flip", "truncate", "garbage"):
        if damage == "flip":  # a byte inside the arrays: the checksum no longer matches
            bad = bytearray(data)
            bad[len(bad) // 2] ^= 0x5A
        elif damage == "truncate":
            bad = data[: len(data) // 3]
        else:
            bad = bytearray(b"not a trie file")
        path.write_bytes(bytes(bad))
        _same(built, trie_cache.trie(v, "all"))
        _same(built, trie_cache.trie(v, "all"))  # (rewritten whole)


def test_checksum_sees_one_word_changed_and_zeroed_runs():
    """Every single-bit flip at words across an odd-length array (the last word included), and
    a zeroed run, change the checksum."""
    data = np.random.default_rng(0).integers(-(2**31), 2**31, size=1001, dtype=np.int64).astype(np.int32)
    base = trie_cache._checksum(data)
    for i in (0, 1, 2, 500, 999, 1000):
        for bit in (0, 17, 31):
            bad = data.copy()
            bad[i] ^= np.int32(-(2**31)) if bit == 31 else np.int32(1 << bit)
            assert trie_cache._checksum(bad) != base, (i, bit)
    bad = data.copy()
    bad[100:164] = 0
    assert trie_cache._checksum(bad) != base
    assert trie_cache._checksum(data[:0]) == trie_cache._checksum(np.zeros(0, np.int32))


def test_unwritable_cache_folder_still_builds(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(blocker))
    v = _vocab(5)
    _same(VocabIndex(v), trie_cache.trie(v, "all"))


def test_other_vocabularies_do_not_share_a_file(cache):
    a, b = _vocab(1), _vocab(2)
    assert trie_cache.vocab_digest(a) != trie_cache.vocab_digest(b)
    _same(VocabIndex(a), trie_cache.trie(a, "all"))
    _same(VocabIndex(b), trie_cache.trie(b, "all"))


def test_equal_vocabularies_share_a_file_however_their_tokens_were_made():
    """The digest is of the tokens' bytes: the same tokens as other objects (copies, one
    object repeated) name the same file, and a token moved from one id to another does not."""
    a = _vocab(3)
    toks = list(a.token_bytes)
    copies = [None if t is None else bytes(bytearray(t)) for t in toks]
    shared = [toks[0] if t == toks[0] else t for t in copies]  # (equal tokens as one object)
    for other in (copies, shared):
        b = Vocabulary(other, eos_ids=[len(other) - 3], vocab_size=a.vocab_size)
        assert trie_cache.vocab_digest(b) == trie_cache.vocab_digest(a)
    swapped = [toks[1], toks[0], *toks[2:]] if toks[0] != toks[1] else [b"zz", *toks[1:]]
    c = Vocabulary(swapped, eos_ids=[len(swapped) - 3], vocab_size=a.vocab_size)
    assert trie_cache.vocab_digest(c) != trie_cache.vocab_digest(a)
