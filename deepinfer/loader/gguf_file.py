"""A fast, safe GGUF reader: metadata and tensor views straight from a memory map.

`gguf.GGUFReader` builds a numpy object per vocabulary entry (~3.5 s for a 49k vocab);
here string arrays are decoded in one pass over the mapped bytes (~0.1 s). Tensor data
stays in the map until it is dequantized. Nothing is ever unpickled or executed.

File layout (little endian, version 2/3)::

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv   x (string key, u32 type, value)
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32) | tensor data

Nothing in the header is trusted: every count and length is checked against the bytes left
in the file before it is used, so a header claiming 2**60 entries fails at once without
allocating, and tensors must lie one after another inside the file as llama.cpp requires.
Errors are `GGUFError`s naming the offset, key or tensor.
"""

from __future__ import annotations

import math
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
# GGML tensor types: id -> (name, values a block holds, bytes a block takes), as llama.cpp's
# ggml.h and the gguf package's GGML_QUANT_SIZES define them (kept here: importing gguf costs
# ~0.5 s, most of a load)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}  # fmt: skip
GGML_TYPE_IDS = {name: i for i, (name, _, _) in GGML_TYPES.items()}
_MAX_DIMS = 4  # GGML_MAX_DIMS
_DEFAULT_ALIGNMENT = 32
# Smallest possible encodings: a key-value pair (empty key, type, a 1-byte value) and a tensor
# info (empty name, n_dims = 0, type, offset). Counts beyond what the file can hold fail early.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8


class GGUFError(ValueError):
    """The file is not a readable GGUF (bad magic, truncated, inconsistent) or not a model this
    engine can run; the message names the offset, metadata key or tensor at fault."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first): the reverse of GGUF's ne[]
    ggml_type: int
    offset: int  # absolute offset in the file
    nbytes: int


def is_int(v: Any) -> bool:
    """A GGUF integer value (any width), not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


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
        self.size = len(self._buf)
        self._pos = 0
        self._what = "the header"  # what is being read, for messages
        try:
            self._parse()
        except GGUFError:
            self.close()
            raise
        except (struct.error, IndexError, UnicodeDecodeError, ValueError, OverflowError) as e:
            self.close()  # (a safety net: every read below is bounds-checked first)
            raise GGUFError(
                f"{self.path!r} is truncated or corrupt: {self._what} at offset {self._pos}: {e}"
            ) from e

    def _error(self, message: str) -> GGUFError:
        return GGUFError(f"{self.path!r} is corrupt: {message}")

    # -- primitive reads -------------------------------------------------------------------
    def _need(self, n: int) -> None:
        if n < 0 or self._pos + n > len(self._buf):
            raise GGUFError(
                f"{self.path!r} is truncated or corrupt: {self._what} at offset {self._pos} needs "
                f"{n} bytes, but the file has only {len(self._buf) - self._pos} left "
                f"(file size {len(self._buf)})"
            )

    def _unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        (v,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += size
        return v

    def _string(self) -> str:
        start = self._pos
        n = self._unpack("<Q")
        self._need(n)
        try:
            s = bytes(self._buf[self._pos : self._pos + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._error(f"{self._what}: the string at offset {start} is not valid UTF-8 ({e})") from e
        self._pos += n
        return s

    def _string_array(self, count: int) -> list[str]:
        buf, pos, end = self._map, self._pos, len(self._buf)
        if count * 8 > end - pos:  # every string has an 8-byte length
            raise GGUFError(
                f"{self.path!r} is truncated or corrupt: {self._what} claims {count} strings at offset "
                f"{pos}, which need at least {count * 8} bytes, but the file has only {end - pos} left"
            )
        out = []
        unpack = struct.Struct("<Q").unpack_from
        for i in range(count):
            if pos + 8 > end:
                raise GGUFError(
                    f"{self.path!r} is truncated or corrupt inside a string array: {self._what}, "
                    f"string #{i} at offset {pos}"
                )
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > end:
                raise GGUFError(
                    f"{self.path!r} is truncated or corrupt inside a string array: {self._what}, "
                    f"string #{i} at offset {pos - 8} claims {n} bytes, the file has {end - pos} left"
                )
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
            at = self._pos
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
            if etype == _ARRAY:  # llama.cpp rejects these too
                raise self._error(f"{self._what} at offset {at} is an array of arrays (not supported)")
            raise self._error(f"{self._what} at offset {at} is an array of unknown value type {etype}")
        raise self._error(f"{self._what} has unknown value type {vtype} (at offset {self._pos - 4})")

    # -- structure -------------------------------------------------------------------------
    def _parse(self) -> None:
        size = len(self._buf)
        self._need(4)
        if bytes(self._buf[:4]) != b"GGUF":
            raise GGUFError(f"{self.path!r} is not a GGUF file (magic {bytes(self._buf[:4])!r})")
        self._pos = 4
        self.version = self._unpack("<I")
        if self.version not in (2, 3):
            endian = " (a big-endian file?)" if self.version in (2 << 24, 3 << 24) else ""
            raise GGUFError(
                f"{self.path!r}: unsupported GGUF version {self.version} at offset 4 (want 2 or 3){endian}"
            )
        n_tensors = self._unpack("<Q")
        n_kv = self._unpack("<Q")
        if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > size - self._pos:
            raise GGUFError(
                f"{self.path!r} is truncated or corrupt: the header (offset 8) claims {n_tensors} tensors "
                f"and {n_kv} metadata entries, more than the {size - self._pos} bytes left can hold"
            )
        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            self._what = f"metadata key #{i}"
            key = self._string()
            if key in self.metadata:
                raise self._error(f"metadata key {key!r} appears twice (the second at entry #{i})")
            self._what = f"the value of metadata key {key!r}"
            self.metadata[key] = self._value(self._unpack("<I"))

        raw = []
        for i in range(n_tensors):
            self._what = f"the name of tensor #{i}"
            name = self._string()
            self._what = f"the info of tensor {name!r}"
            at = self._pos
            n_dims = self._unpack("<I")
            if n_dims > _MAX_DIMS:
                raise self._error(
                    f"tensor {name!r} has n_dims={n_dims} (at offset {at}); expected at most {_MAX_DIMS}"
                )
            dims = [self._unpack("<Q") for _ in range(n_dims)]
            ggml_type = self._unpack("<I")
            offset = self._unpack("<Q")
            raw.append((name, dims, ggml_type, offset, at))
        self._what = "the tensor data"
        align = self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not is_int(align) or align < 1 or align & (align - 1):
            raise GGUFError(f"{self.path!r}: general.alignment={align!r}: expected a positive power of two")
        data_start = (self._pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        expected, previous = 0, None  # tensors follow one another, each padded to `align`
        for name, dims, ggml_type, offset, at in raw:
            if name in self.tensors:
                raise self._error(f"tensor {name!r} appears twice (the second info at offset {at})")
            if ggml_type not in GGML_TYPES:
                raise GGUFError(
                    f"{self.path!r}: tensor {name!r} has unknown ggml type {ggml_type} (info at offset {at})"
                )
            type_name, block, type_size = GGML_TYPES[ggml_type]
            if any(d >= 1 << 63 for d in dims) or math.prod(dims) >= 1 << 63:
                raise self._error(f"tensor {name!r} has dims {dims} (info at offset {at}): too many elements")
            row = dims[0] if dims else 1
            if row % block:
                raise self._error(
                    f"tensor {name!r} has type {type_name}, which stores blocks of {block} values, but "
                    f"its row length ne[0]={row} is not a multiple of {block} (info at offset {at})"
                )
            nbytes = math.prod(dims) // block * type_size
            if offset != expected:
                after = f"after tensor {previous!r}" if previous else "for the first tensor"
                raise self._error(
                    f"tensor {name!r} has data offset {offset} (info at offset {at}); expected {expected} "
                    f"{after} (tensor data is stored in order, each padded to general.alignment={align})"
                )
            start = data_start + offset
            if start + nbytes > size:
                raise GGUFError(
                    f"{self.path!r} is truncated: tensor {name!r} needs bytes up to {start + nbytes}, "
                    f"file has {size}"
                )
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), ggml_type, start, nbytes)
            expected += (nbytes + align - 1) // align * align
            previous = name

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as uint8 rows `[*shape[:-1], bytes_per_row]` (a view of the map)."""
        t = self.tensors[name]
        arr = np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        return arr.reshape(*t.shape[:-1], -1) if t.shape else arr

    def release(self, name: str) -> None:
        """Drop the pages of tensor ``name`` from this process's resident memory (they stay in
        the page cache, and a later read maps them again): a loader calls it once a tensor is
        converted, so that mapped pages do not add up while a model is built."""
        t = self.tensors[name]
        page = mmap.PAGESIZE
        start = t.offset // page * page
        end = min(-(-(t.offset + t.nbytes) // page) * page, self.size)
        try:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (AttributeError, OSError, ValueError):  # no madvise here, or the map is closed
            pass

    def close(self) -> None:
        try:
            self._buf.release()
            self._map.close()
        except BufferError:  # a tensor view still alive (e.g. in a traceback): the GC closes it
            pass
