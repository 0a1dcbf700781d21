"""llama.cpp's quantized blocks: dequantized to float32, or carried as they are (`GGUFMatrix`)
into the CPU's int4 matmul (`deepinfer.kernels.int4_weights`), exactly.

Block layouts (32 weights a block, each row a whole number of blocks):

    Q4_0 = f16 d, 16 B nibbles:           w = (q - 8) d
    Q4_1 = f16 d, f16 m, 16 B nibbles:    w = q d + m
    Q8_0 = f16 d, 32 int8:                w = q d

Nibbles: low halves are weights 0..15 of the block, high halves 16..31.
"""

from __future__ import annotations

import torch

from ..kernels.int4_weights import GROUP, TILE, Int4Weight, check_shape, join, packed_plane, stack_planes
from .gguf_file import GGML_TYPE_IDS, GGML_TYPES, GGUFError

F32, F16, BF16 = GGML_TYPE_IDS["F32"], GGML_TYPE_IDS["F16"], GGML_TYPE_IDS["BF16"]
Q4_0, Q4_1, Q8_0 = GGML_TYPE_IDS["Q4_0"], GGML_TYPE_IDS["Q4_1"], GGML_TYPE_IDS["Q8_0"]
_HEAD = {Q4_0: 2, Q4_1: 4, Q8_0: 2}  # bytes of f16 numbers before a block's weights
INT4_TYPES = (Q4_0, Q4_1, Q8_0)  # the types a GGUFMatrix carries into int4 planes exactly


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] float32 (little-endian half)."""
    return b.contiguous().view(torch.float16)[..., 0].float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] uint8 of a Q4 block -> its 32 weights' q [..., 32] (low halves first)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def dequantize_blocks(raw: torch.Tensor, qtype: int) -> torch.Tensor | None:
    """uint8 bytes (any shape; whole blocks) -> float32, flat; None for a type not done here
    (the gguf package's numpy code then dequantizes it)."""
    t = raw.reshape(-1)
    if qtype == F32:
        return t.view(torch.float32).clone()
    if qtype == F16:
        return t.view(torch.float16).float()
    if qtype == BF16:
        return t.view(torch.bfloat16).float()
    if qtype in (Q4_0, Q4_1):
        head = _HEAD[qtype]
        b = t.view(-1, head + 16)
        q = _nibbles(b[:, head:]).float()  # [blocks, 32]
        d = _f16(b[:, 0:2])[:, None]
        if qtype == Q4_0:
            return ((q - 8.0) * d).view(-1)
        return torch.addcmul(_f16(b[:, 2:4])[:, None], q, d).view(-1)
    if qtype == Q8_0:
        b = t.view(-1, 34)
        return (b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, 0:2])[:, None]).view(-1)
    return None


class GGUFMatrix:
    """A 2-d tensor [rows, cols] of a GGUF file kept in its blocks: ``raw`` [rows, bytes a row]
    uint8 (row r's blocks are its cols weights, in order), a view of the file's map or a copy.
    The loader hands these out for the types of ``INT4_TYPES`` when asked to keep them
    (``load_gguf(keep_blocks=True)``), with ``release``, which drops the file's pages of this
    tensor from the process's resident memory once it has been converted."""

    def __init__(self, raw: torch.Tensor, ggml_type: int, cols: int, release=None, name: str = "a matrix",
                 reorder=None):  # fmt: skip
        self._raw = raw
        self._reorder = reorder  # rows -> rows in another order, applied on first read
        self.ggml_type = ggml_type
        self.shape = torch.Size((raw.shape[0], cols))
        self._release = release
        self.name = name  # for messages: the file and the tensor

    @property
    def raw(self) -> torch.Tensor:
        if self._reorder is not None:
            self._raw, self._reorder = self._reorder(self._raw), None
        return self._raw

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    def release(self) -> None:
        if self._release is not None:
            self._release()

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix [rows, cols]; GGUFError unless every value is finite."""
        out = dequantize_blocks(self.raw, self.ggml_type).view(self.shape)
        self._check(out)
        return out

    def check_finite(self) -> None:
        """GGUFError unless every weight is finite (a quantized block's are iff its f16 numbers are)."""
        head = _HEAD.get(self.ggml_type)
        if head is None:
            self.dequantize()
            return
        b = self.raw.view(self.shape[0], self.shape[1] // GROUP, -1)
        self._check(*(_f16(b[..., i : i + 2]) for i in range(0, head, 2)))

    def _check(self, *values: torch.Tensor) -> None:
        if not all(bool(torch.isfinite(v).all()) for v in values):
            raise GGUFError(f"{self.name} holds values that are not finite (NaN or inf)")

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` (int64 [n]) as float32 [n, cols]: an embedding lookup that dequantizes
        only the rows it reads (bit for bit the rows of ``dequantize()``)."""
        return dequantize_blocks(self.raw[index], self.ggml_type).view(len(index), self.shape[1])

    def with_rows(self, rows: torch.Tensor) -> GGUFMatrix:
        """The same type with other raw rows (a copy of these, for example)."""
        return GGUFMatrix(rows, self.ggml_type, self.shape[1], self._release, self.name)

    def int4(self, chunk: int = 4096) -> Int4Weight | None:
        """The matrix transposed ([cols, rows], for ``x @ w``) as int4 planes, exactly up to the
        bfloat16 rounding of the block scales (kernels/int4_weights.py); None for a type or shape
        the planes cannot hold; GGUFError unless every block scale (and Q4_1 minimum) is finite.
        Converted ``chunk`` rows at a time (a bound on the temporaries)."""
        N, K = self.shape
        if self.ggml_type not in INT4_TYPES or check_shape(K, N):
            return None
        parts = [self._int4(self.raw[r : r + chunk]) for r in range(0, N, chunk)]
        return parts[0] if len(parts) == 1 else join(parts)

    def _int4(self, raw: torch.Tensor) -> Int4Weight:
        """Rows of ``raw`` (a multiple of 64) as planes, their bytes put straight into the kernel's
        layout (``pack_nibbles``: byte (tile t, column k, j) holds rows 64 t + j and 64 t + 32 + j
        of column k in its low and high nibble). For rows j and j + 32, the low nibbles of their
        Q4 bytes make a block's first 16 columns, the high nibbles its last 16; a Q8_0 weight's
        two nibbles go to two planes. The nibbles move a machine word at a time (int32 or int16,
        as the block's size allows), then one transpose puts row j last."""
        N, K = raw.shape[0], self.shape[1]
        head, size = _HEAD[self.ggml_type], GGML_TYPES[self.ggml_type][2]
        word, low, high = (torch.int32, 0x0F0F0F0F, 0xF0F0F0F0 - (1 << 32)) if size % 4 == 0 else \
            (torch.int16, 0x0F0F, 0xF0F0 - (1 << 16))  # fmt: skip
        nb = torch.empty((), dtype=word).element_size()
        blocks = raw.view(N // TILE, 2, TILE // 2, K // GROUP, size)  # tile, half, j, block, bytes
        d = _f16(blocks[..., 0:2]).reshape(N, K // GROUP)
        words = raw.view(word).view(N // TILE, 2, TILE // 2, K // GROUP, size // nb)[..., head // nb :]
        a0, a1 = words[:, 0], words[:, 1]  # rows j and j + 32 of each tile

        def layout(x: torch.Tensor) -> torch.Tensor:  # [tile, j, block, 32 columns] -> [N, K / 2]
            return x.view(torch.uint8).permute(0, 2, 3, 1).reshape(N, K // 2).contiguous()

        if self.ggml_type == Q8_0:  # q + 128 = 16 hi + lo:  q = 16 (hi - 8) + (lo - 8) + 8
            flip = -0x7F80 if word == torch.int16 else -0x7F7F7F80  # 0x8080(8080): q + 128, bytewise
            a0, a1 = a0 ^ flip, a1 ^ flip
            hi = layout(((a0 >> 4) & low) | (a1 & high))
            lo = layout((a0 & low) | ((a1 << 4) & high))
            self._check(d)
            planes = (packed_plane(hi, 16 * d, torch.zeros_like(d)), packed_plane(lo, d, 8 * d))
        else:
            first = (a0 & low) | ((a1 << 4) & high)  # weights 0..15 of each block
            last = ((a0 >> 4) & low) | (a1 & high)  # weights 16..31
            packed = layout(torch.cat([first, last], dim=-1))
            zero = (
                torch.zeros_like(d)
                if self.ggml_type == Q4_0
                else _f16(blocks[..., 2:4]).reshape(N, -1) + 8 * d
            )
            self._check(d, zero)
            planes = (packed_plane(packed, d, zero),)
        return stack_planes(planes, K, N)
