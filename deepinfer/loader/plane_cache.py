"""The int4 planes of a GGUF file's matrices on disk, so that a later load maps them instead of
converting the file's blocks again.

Converting a file's Q4/Q8 blocks into the CPU kernel's layout (`GGUFMatrix.int4`) reads and
writes every weight: about 0.2 s for the embedded 135M-parameter model, seconds for billions.
The first load writes the planes it made, on a thread of its own, to
``<cache dir>/planes/<key>.bin`` (the cache dir is ``DEEPINFER_CACHE_DIR``, else the user's
cache folder, as for the constraint kernels); a later load maps that file and its tensors are
views of the map (pages read as the model first runs them). The key is a hash of the GGUF
file's path, size and modification time, of torch's version (the packed layout is torch's)
and of :data:`VERSION`; a change to any of them makes another file.

A file is a header (magic, :data:`VERSION`, the JSON index's length), the JSON index (tensor name
-> K, N and the byte ranges of its packed planes and of their scales), then the data; it is
written whole to a temporary file and renamed, so a reader sees a whole file or none. One that
does not parse, or whose index points past its end, is ignored (and replaced). A folder that
cannot be written only costs the conversion. ``DEEPINFER_PLANE_CACHE=0`` turns the cache off;
``DEEPINFER_PLANE_CACHE=<folder>`` puts the files there instead.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import tempfile
import threading
import warnings

import torch

from ..kernels.int4_gemv import cache_dir
from ..kernels.int4_weights import Int4Weight

VERSION = 2  # of the file layout and of how planes are made: a change to either must bump it
ENV = "DEEPINFER_PLANE_CACHE"
MAGIC = b"DIPLANES"
_HEAD = struct.Struct("<8sII")  # magic, version, index length
_ALIGN = 64


class PlaneCache:
    """The planes of one GGUF file: ``get(name)`` from disk, ``put(name, w)`` what was converted,
    ``save()`` once the model is built (writes a file only when there was none)."""

    def __init__(self, gguf_path: str):
        self.path: str | None = None
        self._stored: dict[str, Int4Weight] = {}
        self._new: dict[str, Int4Weight] = {}
        where = os.environ.get(ENV, "")
        if where == "0":
            return
        st = os.stat(gguf_path)
        ident = f"v{VERSION}|{os.path.realpath(gguf_path)}|{st.st_size}|{st.st_mtime_ns}|{torch.__version__}"
        key = hashlib.sha256(ident.encode()).hexdigest()[:32]
        self.path = os.path.join(where or os.path.join(cache_dir(), "planes"), f"{key}.bin")
        self._stored = _read(self.path) or {}

    def get(self, name: str) -> Int4Weight | None:
        return self._stored.get(name)

    def put(self, name: str, w: Int4Weight) -> None:
        if self.path is not None and name not in self._stored:
            self._new[name] = w

    def save(self, wait: bool = False) -> None:
        """Write the planes converted by this load, unless the file held them already: on a
        thread of its own, so that the model serves meanwhile (the process waits for it at
        exit); ``wait``: here and now."""
        if self.path is None or not self._new or self._stored:
            return
        new, self._new = self._new, {}
        if wait:
            _save(self.path, new)
            return
        self.writer = threading.Thread(target=_save, args=(self.path, new), name="deepinfer-plane-cache")
        self.writer.start()


def _save(path: str, planes: dict[str, Int4Weight]) -> None:
    try:
        _write(path, planes)
    except OSError:  # a folder that cannot be written: the next load converts again
        pass


def _read(path: str) -> dict[str, Int4Weight] | None:
    """The planes of a whole file, as views of its map; None if it is absent or not whole."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _HEAD.size:
                return None
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    try:
        magic, version, n = _HEAD.unpack_from(buf, 0)
        if magic != MAGIC or version != VERSION or _HEAD.size + n > size:
            return None
        index = json.loads(bytes(buf[_HEAD.size : _HEAD.size + n]))
        base = _data_start(n)  # index offsets count from here
        out = {}
        with warnings.catch_warnings():  # a read-only map: nothing writes to these tensors
            warnings.simplefilter("ignore", UserWarning)
            for name, e in index.items():
                (po, pn), (so, sn) = e["packed"], e["scale_zeros"]
                if base + max(po + pn, so + sn) > size:
                    return None
                packed = torch.frombuffer(buf, dtype=torch.uint8, count=pn, offset=base + po)
                sz = torch.frombuffer(buf, dtype=torch.bfloat16, count=sn // 2, offset=base + so)
                out[name] = Int4Weight(packed.view(e["n"], -1), sz.view(-1, e["n"], 2), e["k"], e["n"])
        return out
    except (ValueError, KeyError, TypeError, RuntimeError, struct.error):
        return None


def _data_start(index_len: int) -> int:
    return -(-(_HEAD.size + index_len) // _ALIGN) * _ALIGN


def _write(path: str, planes: dict[str, Int4Weight]) -> None:
    index, chunks, at = {}, [], 0  # offsets from the data's start
    for name, w in planes.items():
        entry = {"k": w.k, "n": w.n}
        for field, t in (("packed", w.packed), ("scale_zeros", w.scale_zeros)):
            data = t.contiguous().view(torch.uint8).reshape(-1).numpy()  # (written as it is)
            pad = -at % _ALIGN
            chunks += [b"\0" * pad, data]
            entry[field] = [at + pad, data.nbytes]
            at += pad + data.nbytes
        index[name] = entry
    body = json.dumps(index).encode()
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(_HEAD.pack(MAGIC, VERSION, len(body)))
            out.write(body)
            out.write(b"\0" * (_data_start(len(body)) - _HEAD.size - len(body)))
            for c in chunks:
                out.write(c)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
