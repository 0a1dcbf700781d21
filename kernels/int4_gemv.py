"""The int4 matmul of a few activation rows (a decode step) with int8 activations, in C
(``int4_gemv.c``): llama.cpp's arithmetic over the CPU kernel's int4 planes
(kernels/int4_weights.py), read in their own layout (no other copy of the weights).

Each row of x is quantized per group of 32 (d = max|x| / 127, q = x / d rounded to nearest even,
t = d sum(q)); a group of an output column is then one integer dot product of the weights' 4-bit
q with the activations' int8 q (``vpdpbusd`` on AVX-512 VNNI), and

    y[n] = sum over groups g of  s[g, n] (d_g sum_k q_w[k, n] q_x[k] - 8 t_g) + z[g, n] t_g

for the weight ``(q_w - 8) s + z``. :func:`int4_gemv_reference` is this arithmetic in torch
(float64 sums). torch's bfloat16 kernel is bound by its arithmetic at decode (9-16 GB/s of
weights); this one by the weights' bytes.

The library (this GEMV, the add + RMSNorm of kernels/add_rms_norm.py and the others of `SOURCES`) is
compiled by ``python -m deepinfer.kernels.int4_gemv [--if-missing] [FOLDER]``
(``./build.sh install`` runs it) with the C compiler (``CC``, else ``cc``) and
``-O3 -march=native``: the build runs where it is built, and its path (AVX-512 VNNI,
AVX-VNNI, AVX2 or plain C) is what the compiler finds on this machine. It lives in the cache
folder of the constraint kernels (``DEEPINFER_CACHE_DIR``, else the user's cache folder) under
a key hashing the C source and the CPU's flags, beside a manifest with its SHA-256; it is
written to a temporary file and renamed, and loaded only when it matches its manifest. Without
a build (no compiler, ``DEEPINFER_INT4_GEMV=0``) :func:`available` is False and the matmul
stays torch's (`int4_matmul`), always correct. Loaded with ctypes.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

import torch

from .int4_weights import GROUP, TILE, Int4Weight

ENV = "DEEPINFER_INT4_GEMV"  # "0": never use the C kernel
_HERE = os.path.dirname(os.path.abspath(__file__))
# the library's C sources: this GEMV, the add + RMSNorm of kernels/add_rms_norm.py, the column
# lookup of `int4_weights.int4_rows`, a decode row's attention (kernels/decode_attention_c.py), its
# RoPE + K/V store (kernels/rope_store_c.py) and its SwiGLU (kernels/glu_c.py)
SOURCES = tuple(
    os.path.join(_HERE, f)
    for f in ("int4_gemv.c", "add_rms_norm.c", "int4_rows.c", "decode_attention.c", "rope_store.c", "glu.c")
)
HEADERS = tuple(os.path.join(_HERE, f) for f in ("bf16.h", "exp_poly.h"))  # included: part of the key
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-fno-math-errno", "-ffp-contract=off", "-fopenmp"]
PARALLEL = 1 << 20  # weights (K N) from which a matmul splits its columns over torch's threads


def cache_dir() -> str:
    """Where builds and caches live: ``DEEPINFER_CACHE_DIR``, else the user's cache folder
    (deepinfer.constraints.native's rule; the plane cache uses this one)."""
    d = os.environ.get("DEEPINFER_CACHE_DIR")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "deepinfer")


def _cpu_flags() -> bytes:
    try:
        with open("/proc/cpuinfo", "rb") as f:
            return next((line for line in f if line.startswith(b"flags")), b"")
    except OSError:
        return b""


def build_key() -> str:
    """A hash of the C sources, the flags and the CPU (-march=native builds for this CPU)."""
    h = hashlib.sha256()
    for src in SOURCES + HEADERS:
        with open(src, "rb") as f:
            h.update(f.read())
    h.update(" ".join(FLAGS).encode() + platform.machine().encode() + _cpu_flags())
    return h.hexdigest()[:20]


def build_paths(folder: str | None = None) -> tuple[str, str]:
    """The library and manifest paths of this source's build in ``folder``."""
    folder = folder or cache_dir()
    name = f"_deepinfer_int4_gemv_{build_key()}"
    return os.path.join(folder, name + ".so"), os.path.join(folder, name + ".json")


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def build(folder: str | None = None) -> str:
    """Compile the library into ``folder`` (atomically, with its manifest); its path."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc, gcc or $CC) found")
    so, man = build_paths(folder)
    os.makedirs(os.path.dirname(so), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(so), suffix=".so.tmp")
    os.close(fd)
    try:
        flags = FLAGS
        try:
            subprocess.run(
                [cc, *flags, "-o", tmp, *SOURCES, "-lm"], check=True, capture_output=True, text=True
            )
        except subprocess.CalledProcessError:  # a compiler without OpenMP: one thread
            flags = [f for f in FLAGS if f != "-fopenmp"]
            subprocess.run(
                [cc, *flags, "-o", tmp, *SOURCES, "-lm"], check=True, capture_output=True, text=True
            )
        meta = {"key": build_key(), "sha256": _sha(tmp), "compiler": cc, "flags": flags}
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(so), suffix=".json.tmp", delete=False) as f:
            json.dump(meta, f)
        os.replace(tmp, so)
        os.replace(f.name, man)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"{cc} failed on {', '.join(SOURCES)}: {e.stderr.strip()}") from None
    except OSError as e:
        raise RuntimeError(f"cannot run the C compiler {cc!r} or write {so}: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return so


class _State:
    lib = None  # the loaded library
    fn = None  # its int4_gemv
    norm = None  # its add_rms_norm
    columns = None  # its int4_columns
    attention = None  # its decode_attention
    attention_rows = None  # its decode_attention_rows
    rope = None  # its rope_store
    glu = None  # its glu_silu
    why = "not loaded yet"  # why the C kernel is not in use
    isa = ""  # the path the build took


STATE = _State()


def load(folder: str | None = None) -> bool:
    """Load this source's build (once it matches its manifest); whether the kernel is usable."""
    STATE.lib = STATE.fn = STATE.norm = STATE.columns = STATE.attention = STATE.rope = STATE.glu = None
    STATE.attention_rows = None
    if os.environ.get(ENV) == "0":
        STATE.why = f"{ENV}=0"
        return False
    try:
        so, man = build_paths(folder)
        if not (os.path.exists(so) and os.path.exists(man)):
            STATE.why = f"no build in {os.path.dirname(so)} (python -m deepinfer.kernels.int4_gemv builds it)"
            return False
        with open(man, encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("key") != build_key() or meta.get("sha256") != _sha(so):
            STATE.why = f"build {so} does not match its manifest (stale or corrupt): not loaded"
            return False
        lib = ctypes.CDLL(so)
    except (OSError, ValueError) as e:
        STATE.why = f"build not loaded: {type(e).__name__}: {e}"
        return False
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.int4_gemv.argtypes = [p, i64, i64, i64, i64, p, p, p, ctypes.c_int]
    lib.int4_gemv.restype = ctypes.c_int
    lib.int4_gemv_isa.restype = ctypes.c_char_p
    lib.add_rms_norm.argtypes = [p, p, p, ctypes.c_float, i64, i64, p, p]
    lib.add_rms_norm.restype = None
    lib.int4_columns.argtypes = [p, p, i64, i64, i64, p, i64, p]
    lib.int4_columns.restype = None
    lib.decode_attention.argtypes = [p, p, p, p, i64, i64, i64, i64, i64, p, p]
    lib.decode_attention.restype = ctypes.c_int
    lib.decode_attention_rows.argtypes = [p, p, p, p, i64, p, i64, i64, i64, i64, p, p, ctypes.c_int]
    lib.decode_attention_rows.restype = ctypes.c_int
    lib.rope_store.argtypes = [p, i64, p, i64, p, p, p, i64, i64, i64, i64, i64, p, p, p]
    lib.rope_store.restype = ctypes.c_int
    lib.glu_silu.argtypes = [p, i64, i64, p]
    lib.glu_silu.restype = None
    STATE.isa = lib.int4_gemv_isa().decode()
    STATE.lib, STATE.fn, STATE.norm, STATE.columns = lib, lib.int4_gemv, lib.add_rms_norm, lib.int4_columns
    STATE.attention, STATE.rope, STATE.glu = lib.decode_attention, lib.rope_store, lib.glu_silu
    STATE.attention_rows = lib.decode_attention_rows
    STATE.why = ""
    return True


def available() -> bool:
    return STATE.lib is not None


def int4_gemv(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x [..., K] bfloat16 (contiguous) @ w -> [..., N] bfloat16, x's rows quantized to int8 (the
    C kernel; `available` must be True). The caller checks x (`quantized.matmul`)."""
    k = w.k
    y = torch.empty((*x.shape[:-1], w.n), dtype=torch.bfloat16)
    threads = torch.get_num_threads() if k * w.n >= PARALLEL else 1
    rc = STATE.fn(x.data_ptr(), x.numel() // k, k, 2 * w.packed.shape[1] // k, w.n, w.packed.data_ptr(),
                  w.scale_zeros.data_ptr(), y.data_ptr(), threads)  # fmt: skip
    if rc:
        raise MemoryError("int4_gemv: out of memory for the activations' int8 copy")
    return y


def int4_columns(w: Int4Weight, index: torch.Tensor) -> torch.Tensor:
    """Columns ``index`` (int64 [n], each in [0, N)) of the matrix as float32 rows [n, K], in C:
    bit for bit `int4_weights.int4_rows` (`STATE.columns` must be loaded)."""
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= w.n):
        raise IndexError(f"column index out of range [0, {w.n})")
    index = index.contiguous()
    out = torch.empty((index.shape[0], w.k), dtype=torch.float32)
    STATE.columns(w.packed.data_ptr(), w.scale_zeros.data_ptr(), w.k, 2 * w.packed.shape[1] // w.k, w.n,
                  index.data_ptr(), index.shape[0], out.data_ptr())  # fmt: skip
    return out


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> q [M, K / 32, 32] (integers in float32), d and t = d sum(q) [M, K / 32] float32:
    the C kernel's activation quantization (its float32 operations, in order)."""
    v = x.float().view(x.shape[0], -1, GROUP)
    d = v.abs().amax(-1) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(v * inv[..., None])  # half to even, as nearbyintf
    return q, d, d * q.sum(-1)


def int4_gemv_reference(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """The oracle of `int4_gemv`: its arithmetic in torch, sums in float64 -> float32 [M, N]."""
    q, d, t = quantize_rows_reference(x)
    P, G = w.count, w.k // GROUP
    sz = w.scale_zeros.double().view(P, G, w.n, 2)
    s, z = sz[..., 0], sz[..., 1]
    qw = (_unpack_q(w).view(P, G, GROUP, w.n)).double()  # [P, G, 32, N] in [0, 16)
    dots = torch.einsum("mgk,pgkn->mpgn", q.double(), qw)  # [M, P, G, N]
    d64, t64 = d.double()[:, None, :, None], t.double()[:, None, :, None]
    y = s[None] * (d64 * dots - 8 * t64) + z[None] * t64
    return y.sum((1, 2)).float()


def _unpack_q(w: Int4Weight) -> torch.Tensor:
    """The 4-bit q of every plane, [P K, N] float32 (the layout: tiles of 64 columns, byte j of
    an input holding columns j and j + 32 of its tile)."""
    b = w.packed.view(w.n // TILE, -1, TILE // 2)  # [N / 64, P K, 32]
    return torch.stack([b & 15, b >> 4], dim=1).permute(2, 0, 1, 3).reshape(-1, w.n).float()


def main(argv: list[str]) -> None:
    folder = next((a for a in argv if not a.startswith("--")), None)
    if "--if-missing" in argv and all(map(os.path.exists, build_paths(folder))):
        print(build_paths(folder)[0])
        return
    try:
        print(build(folder))
    except RuntimeError as e:
        sys.exit(f"C int4 GEMV not built: {e}")


load()

if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
