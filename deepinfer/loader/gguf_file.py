"""A fast, safe GGUF reader: metadata and tensor views straight from a memory map.

`gguf.GGUFReader` builds a numpy object per vocabulary entry (~3.5 s for a 49k vocab);
here string arrays are decoded in one pass over the mapped bytes (~0.1 s). Tensor data
stays in the map until it is dequantized. Nothing is ever unpickled or executed.

File layout (little endian, version 2/3)::

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv   x (string key, u32 type, value)
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32) | tensor data
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

# GGUF value types -> (struct format, numpy dtype) for scalars.
_SCALARS: dict[int, tuple[str, np.dtype]] = {
    0: ("<B", np.dtype("<u1")),
    1: ("<b", np.dtype("<i1")),
    2: ("<H", np.dtype("<u2")),
    3: ("<h", np.dtype("<i2")),
    4: ("<I", np.dtype("<u4")),
    5: ("<i", np.dtype("<i4")),
    6: ("<f", np.dtype("<f4")),
    7: ("<?", np.dtype("?")),
    10: ("<Q", np.dtype("<u8")),
    11: ("<q", np.dtype("<i8")),
    12: ("<d", np.dtype("<f8")),
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a readable GGUF (bad magic, truncated, inconsistent)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first): the reverse of GGUF's ne[]
    ggml_type: int
    offset: int  # absolute offset in the file
    nbytes: int


class GGUFFile:
    """Metadata (`.metadata`: key -> python value / numpy array / list[str]) and tensors."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"GGUF file not found: {self.path!r}")
        with open(self.path, "rb") as f:
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as e:  # empty file
                raise GGUFError(f"{self.path!r} is not a GGUF file: it is empty") from e
        self._buf = memoryview(self._map)
        self._pos = 0
        try:
            self._parse()
        except (struct.error, IndexError, UnicodeDecodeError, ValueError) as e:
            if isinstance(e, GGUFError):
                raise
            raise GGUFError(f"{self.path!r} is truncated or corrupt: {e}") from e

    # -- primitive reads -------------------------------------------------------------------
    def _need(self, n: int) -> None:
        if n < 0 or self._pos + n > len(self._buf):
            raise GGUFError(
                f"{self.path!r} is truncated or corrupt: wanted {n} bytes at offset {self._pos}, "
                f"file has {len(self._buf)}"
            )

    def _unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        (v,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += size
        return v

    def _string(self) -> str:
        n = self._unpack("<Q")
        self._need(n)
        s = bytes(self._buf[self._pos : self._pos + n]).decode("utf-8")
        self._pos += n
        return s

    def _string_array(self, count: int) -> list[str]:
        buf, pos, end = self._map, self._pos, len(self._buf)
        out = []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise GGUFError(f"{self.path!r} is truncated or corrupt inside a string array")
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > end:
                raise GGUFError(f"{self.path!r} is truncated or corrupt inside a string array")
            out.append(buf[pos : pos + n].decode("utf-8", errors="surrogateescape"))
            pos += n
        self._pos = pos
        return out

    def _value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self._unpack(_SCALARS[vtype][0])
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            etype = self._unpack("<I")
            count = self._unpack("<Q")
            if etype in _SCALARS:
                dt = _SCALARS[etype][1]
                self._need(count * dt.itemsize)
                arr = np.frombuffer(self._map, dtype=dt, count=count, offset=self._pos).copy()
                self._pos += count * dt.itemsize
                return arr
            if etype == _STRING:
                return self._string_array(count)
            return [self._value(etype) for _ in range(count)]
        raise GGUFError(f"{self.path!r} is corrupt: unknown metadata value type {vtype}")

    # -- structure -------------------------------------------------------------------------
    def _parse(self) -> None:
        self._need(4)
        if bytes(self._buf[:4]) != b"GGUF":
            raise GGUFError(f"{self.path!r} is not a GGUF file (magic {bytes(self._buf[:4])!r})")
        self._pos = 4
        self.version = self._unpack("<I")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path!r}: unsupported GGUF version {self.version} (want 2 or 3)")
        n_tensors = self._unpack("<Q")
        n_kv = self._unpack("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._unpack("<I"))

        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        raw = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._unpack("<I")
            if n_dims > 8:
                raise GGUFError(f"{self.path!r} is corrupt: tensor {name!r} has {n_dims} dims")
            dims = [self._unpack("<Q") for _ in range(n_dims)]
            ggml_type = self._unpack("<I")
            offset = self._unpack("<Q")
            raw.append((name, dims, ggml_type, offset))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = (self._pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, ggml_type, offset in raw:
            try:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
            except (ValueError, KeyError) as e:
                raise GGUFError(f"{self.path!r}: tensor {name!r} has unknown ggml type {ggml_type}") from e
            n = int(np.prod(dims)) if dims else 1
            nbytes = n // block * type_size
            start = data_start + offset
            if start + nbytes > len(self._buf):
                raise GGUFError(
                    f"{self.path!r} is truncated: tensor {name!r} needs bytes up to {start + nbytes}, "
                    f"file has {len(self._buf)}"
                )
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), ggml_type, start, nbytes)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as uint8 rows `[*shape[:-1], bytes_per_row]` (a view of the map)."""
        t = self.tensors[name]
        arr = np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        return arr.reshape(*t.shape[:-1], -1) if t.shape else arr

    def close(self) -> None:
        self._buf.release()
        self._map.close()
