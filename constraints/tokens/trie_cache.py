"""The vocabulary tries on disk: a new process loads them instead of building them.

Building a trie sorts every token's bytes in Python (about a second for Llama 3's 128k
tokens, three tries per vocabulary: all tokens, and those without and with ``"``); loading
its arrays takes milliseconds. A file is named by the SHA-256 of the vocabulary (each
token's bytes and the logits width), the part and :data:`VERSION`, in
``<cache dir>/tries/`` (:func:`..native.cache_dir`). It holds the trie's
:data:`~.trie.VocabIndex.BASE` arrays and their Adler-32 checksum: a file that does not
load, or whose arrays do not match the checksum, is built again, and written atomically
(a temporary file, then a rename). A folder that cannot be written only costs the build.
``DEEPINFER_TRIE_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import zlib

import numpy as np

from ..native import cache_dir
from .trie import VocabIndex

VERSION = 1  # of the trie's layout: a change to how a trie is built must bump it
ENV = "DEEPINFER_TRIE_CACHE"


def vocab_digest(vocab) -> str:
    """SHA-256 of the token bytes (None: absent) and the logits width, kept on ``vocab``."""
    d = vocab.__dict__.get("_digest")
    if d is None:
        h = hashlib.sha256(f"v{VERSION}|{vocab.vocab_size}|".encode())
        h.update(pickle.dumps(list(vocab.token_bytes), protocol=5))  # (unambiguous, at C speed)
        d = vocab.__dict__["_digest"] = h.hexdigest()[:32]
    return d


def _checksum(arrays: dict) -> int:
    c = 1
    for name in VocabIndex.BASE:
        c = zlib.adler32(np.ascontiguousarray(arrays[name]).data, c)
    return c


def trie(vocab, part: str, keep=None) -> VocabIndex:
    """The trie of ``vocab``'s tokens that ``keep`` (None: all) takes; ``part`` names that
    subset in the file name (``"all"``, ``"without-22"``, ``"with-22"``)."""
    if os.environ.get(ENV, "1") == "0":
        return VocabIndex(vocab, keep=keep)
    path = os.path.join(cache_dir(), "tries", f"{vocab_digest(vocab)}-{part}.npz")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {name: f[name] for name in VocabIndex.BASE}
            stored = int(f["checksum"])
        if stored == _checksum(arrays):
            return VocabIndex.from_arrays(vocab.vocab_size, arrays)
    except Exception:  # noqa: BLE001 - absent, unreadable or corrupt: built again
        pass
    index = VocabIndex(vocab, keep=keep)
    arrays = {name: getattr(index, name) for name in VocabIndex.BASE}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                np.savez(out, checksum=np.int64(_checksum(arrays)), **arrays)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:  # a read-only or full disk: the trie is still built
        pass
    return index
