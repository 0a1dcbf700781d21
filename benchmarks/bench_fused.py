"""The fused layer kernels of kernels/fused.py (add + RMSNorm, RoPE + K/V store, GLU) beside
their torch references and the memory floor. Prints a table, asserts nothing.

    python benchmarks/bench_fused.py [--shapes llama3-8b,smollm2-135m] [--tokens 1,64,192,576]

Per model shape and token count, bf16: µs a launch, timed as one CUDA graph of as many launches
as the model has layers, replayed (``bench_decode._graph_seconds``); the reference is the same
op in torch ops (several kernels). The floor is the bytes the op must read and write at the
measured copy bandwidth. "equals reference": the kernel's outputs bit for bit (the kernels keep
the references' roundings, but the GPU compiler may fuse a product and a sum: an ulp). A
decode step runs each kernel once a layer at its batch's rows, a verify step of T positions at
T times that; prompt chunks at up to a chunk's tokens. On the CPU (TRITON_INTERPRET=1, the
tiny shape) it checks the script only.
"""

from __future__ import annotations

import argparse
import os
from functools import partial

import torch
from bench_decode import _config, _copy_bandwidth, _graph_seconds, _table


def _ops(cfg, N: int, device, dtype, layers: int):
    """(op, kernel calls, reference calls, bytes moved, check) for N tokens; check() runs one
    kernel and one reference call on fresh buffers and says whether their outputs are equal."""
    from deepinfer.kernels import fused as fk
    from deepinfer.models.layers import rope_inv_freq, rope_tables

    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, generator=g)

    H, I, nh, nkv, hd = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    e = torch.finfo(dtype).bits // 8
    out = []
    # add + RMSNorm: x + d written, and its norm
    x, d, w = rnd(N, H), rnd(N, H), rnd(H)
    eps = cfg.rms_norm_eps
    out.append((
        "add + RMSNorm",
        [partial(fk.add_rms_norm, x, d, w, eps)] * layers,
        [partial(fk.add_rms_norm_reference, x, d, w, eps)] * layers,
        4 * N * H * e + H * e,
        lambda: all(torch.equal(a, b) for a, b in zip(fk.add_rms_norm(x, d, w, eps),
                                                       fk.add_rms_norm_reference(x, d, w, eps))),
    ))  # fmt: skip
    # RoPE on q and k, q out, k and v written at the tokens' slots
    cos, sin = rope_tables(rope_inv_freq(cfg), 4096, device, dtype)
    qkv = rnd(N, nh + 2 * nkv, hd)
    qk, v = qkv[:, : nh + nkv], qkv[:, nh + nkv :]
    pos = torch.randint(0, 4096, (N,), device=device, generator=g)
    slots = torch.randperm(max(4 * N, 64), device=device, generator=g)[:N]
    caches = [torch.zeros(max(4 * N, 64), nkv, hd, device=device, dtype=dtype) for _ in range(4)]

    def rope_check():
        q1 = fk.rope_store(qk, v, cos, sin, pos, caches[0], caches[1], slots, nh)
        q2 = fk.rope_store_reference(qk, v, cos, sin, pos, caches[2], caches[3], slots, nh)
        return torch.equal(q1, q2) and torch.equal(caches[0][slots], caches[2][slots])

    out.append((
        "RoPE + K/V store",
        [partial(fk.rope_store, qk, v, cos, sin, pos, caches[0], caches[1], slots, nh)] * layers,
        [partial(fk.rope_store_reference, qk, v, cos, sin, pos, caches[2], caches[3], slots, nh)] * layers,
        N * ((nh + nkv) * hd + nkv * hd + nh * hd + 2 * nkv * hd) * e + 2 * N * hd * e,
        rope_check,
    ))  # fmt: skip
    # GLU of the fused gate|up output
    gu = rnd(N, 2 * I)
    out.append((
        "GLU (SiLU)",
        [partial(fk.glu, gu, "silu")] * layers,
        [partial(fk.glu_reference, gu, "silu")] * layers,
        3 * N * I * e,
        lambda: torch.equal(fk.glu(gu, "silu"), fk.glu_reference(gu, "silu")),
    ))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="llama3-8b,smollm2-135m")
    ap.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64, 192, 576])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), torch.bfloat16
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("on the CPU the Triton kernels need TRITON_INTERPRET=1")
    bw = _copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (a check of the script)"
    print(f"{name}: copy bandwidth {bw / 1e9:.0f} GB/s; bf16", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        cfg = _config(shape)
        layers = cfg.num_layers if device.type == "cuda" else 2
        for N in args.tokens:
            for op, calls, ref, nbytes, check in _ops(cfg, N, device, dtype, layers):
                t, t_ref = _graph_seconds(calls, device), _graph_seconds(ref, device)
                floor = nbytes / bw
                same = "yes" if check() else "no"
                rows.append([shape, op, N, f"{floor * 1e6:.2f}", f"{t * 1e6:.2f}", f"{t_ref * 1e6:.2f}",
                             f"{t_ref / t:.1f}x", f"{floor / t:.0%}", same])  # fmt: skip
                print("  " + " | ".join(map(str, rows[-1])), flush=True)
    _table(["shape", "op", "tokens", "floor µs", "kernel µs", "torch reference µs", "speed-up", "of floor",
            "equals reference"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
