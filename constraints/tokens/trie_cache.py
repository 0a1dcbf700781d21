"""The vocabulary tries on disk: a new process loads them instead of building them.

Building a trie sorts every token's bytes in Python (about a second for Llama 3's 128k
tokens, up to five tries per vocabulary: all tokens, those without and with ``"``, and
the short and the long ones without ``"``); loading
its arrays takes milliseconds. A file is named by the SHA-256 of the vocabulary (each
token's bytes and the logits width) and the part, in ``<cache dir>/tries/``
(:func:`..native.cache_dir`). It holds a header (magic, :data:`VERSION`, a checksum of
the data (:func:`_checksum`), each array's length), then the trie's
:data:`~.trie.VocabIndex.BASE` and ``DERIVED`` arrays as int32: a file that does not load, or does not
match its header, is built again, and written atomically (a temporary file, then a
rename). A folder that cannot be written only costs the build. ``DEEPINFER_TRIE_CACHE=0``
turns the cache off.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import tempfile

import numpy as np

from ..native import cache_dir
from .trie import VocabIndex

VERSION = 4  # of the trie file: a change to how a trie is built, or stored, must bump it
ENV = "DEEPINFER_TRIE_CACHE"


def vocab_digest(vocab) -> str:
    """SHA-256 of the token bytes (None: absent) and the logits width, kept on ``vocab``."""
    d = vocab.__dict__.get("_digest")
    if d is None:
        h = hashlib.sha256(f"v{VERSION}|{vocab.vocab_size}|".encode())
        # (unambiguous, at C speed: marshal's version 2 writes every object in full, no
        # references, so equal token lists give equal bytes; 2 ms for Llama 3's 128k tokens)
        h.update(marshal.dumps(tuple(vocab.token_bytes), 2))
        d = vocab.__dict__["_digest"] = h.hexdigest()[:32]
    return d


MAGIC = 0x54524945  # "TRIE"
STORED = (*VocabIndex.BASE, *VocabIndex.DERIVED)  # (the derived ones: no work on loading)
HEAD = 3 + len(STORED)  # magic, version, checksum, then each array's length


def _checksum(data: np.ndarray) -> int:
    """31 bits of a hash of the int32 data's 64-bit words' sum and XOR (and of a last odd
    word): a word changed, a zeroed run or a torn write changes the sum. Two vectorised
    passes: under a millisecond for Llama 3's 16 MB tries."""
    words = data[: len(data) & ~1].view(np.uint64)
    total = int(words.sum(dtype=np.uint64)) if len(words) else 0
    xor = int(np.bitwise_xor.reduce(words)) if len(words) else 0
    tail = int(data[-1]) & 0xFFFFFFFF if len(data) & 1 else 0
    key = total.to_bytes(8, "little") + xor.to_bytes(8, "little") + tail.to_bytes(4, "little")
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little") & 0x7FFFFFFF


def _read(path: str) -> dict | None:
    """The arrays of a trie file, or None if it is not a whole one (one int32 array: the
    header, then each :data:`~.trie.VocabIndex.BASE` array end to end)."""
    raw = np.fromfile(path, dtype=np.int32)
    if len(raw) < HEAD or raw[0] != MAGIC or raw[1] != VERSION:
        return None
    lens = raw[3:HEAD].astype(np.int64)
    data = raw[HEAD:]
    if (lens < 0).any() or int(lens.sum()) != len(data) or int(raw[2]) != _checksum(data):
        return None
    ends = np.cumsum(lens).tolist()
    return {name: data[e - n : e] for name, n, e in zip(STORED, lens.tolist(), ends)}


def _write(path: str, index: VocabIndex) -> None:
    parts = [np.ascontiguousarray(getattr(index, name)).reshape(-1).view(np.int32) for name in STORED]
    data = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    head = np.array([MAGIC, VERSION, _checksum(data), *(len(p) for p in parts)], dtype=np.int32)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(head.tobytes())
            out.write(data.tobytes())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def trie(vocab, part: str, keep=None) -> VocabIndex:
    """The trie of ``vocab``'s tokens that ``keep`` (None: all) takes; ``part`` names that
    subset in the file name (``"all"``, ``"without-22"``, ``"with-22"``, ``"without-22-upto-16"``, ...)."""
    if os.environ.get(ENV, "1") == "0":
        return VocabIndex(vocab, keep=keep)
    path = os.path.join(cache_dir(), "tries", f"{vocab_digest(vocab)}-{part}.bin")
    try:
        arrays = _read(path)
        if arrays is not None:
            return VocabIndex.from_arrays(vocab.vocab_size, arrays)
    except Exception:  # noqa: BLE001 - absent, unreadable or corrupt: built again
        pass
    index = VocabIndex(vocab, keep=keep)
    try:
        _write(path, index)
    except OSError:  # a read-only or full disk: the trie is still built
        pass
    return index
