"""The batch-invariant matmul (deepinfer/kernels/invariant_triton.py) against cuBLAS, at a model's
projection shapes, from one row (decode) to prompt-sized row counts (prefill).

For each (projection, rows): cuBLAS (torch.matmul), the invariant matmul as the engine runs it,
and, with --tiles, other tiles for the prompt-sized way. Every variant's bits are compared with
the same rows computed alone in row blocks of one (the decode path), which is what makes it
batch-invariant: "bits" is "same" or the number of differing elements.

    python benchmarks/bench_invariant.py --shape llama3-8b --rows 1,16,2048,8192 \\
        --tiles 128:128:8:3,128:256:8:3
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "0")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

# (hidden, intermediate, q heads, kv heads, head dim) of the shapes measured here
SHAPES = {"llama3-8b": (4096, 14336, 32, 8, 128), "smollm2-135m": (576, 1536, 9, 3, 64)}


def projections(shape: str) -> list[tuple[str, int, int]]:
    """(name, K, N) of a layer's matmuls: fused q|k|v, o, fused gate|up, down."""
    h, inter, nq, nkv, d = SHAPES[shape]
    return [("qkv", h, (nq + 2 * nkv) * d), ("o", nq * d, h), ("gate_up", h, 2 * inter), ("down", inter, h)]


def _time_us(fn, reps: int) -> float:
    """Microseconds a call of `fn` takes on the device: `fn` captured in a CUDA graph (so
    Python's launch cost is not counted, as in the engine's graphs), replayed `reps` times a
    round; the median of 5 rounds."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    rounds = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) * 1e3 / reps)
    return sorted(rounds)[2]


def _bits(got: torch.Tensor, a: torch.Tensor, w: torch.Tensor, rows: list[int]) -> str:
    """'same' when each of `rows` of `got` equals that row computed alone, else the count of
    differing elements."""
    from deepinfer.kernels import invariant_triton as kt

    bad = sum(int((got[r] != kt.matmul(a[r : r + 1], w)[0]).sum()) for r in rows)
    return "same" if bad == 0 else str(bad)


def _row(name: str, w: torch.Tensor, a: torch.Tensor, tiles: list[tuple[bool, tuple]], reps: int) -> list:
    """One table row: `a` @ `w` by cuBLAS, the invariant matmul and its variants."""
    from deepinfer.kernels import invariant_triton as kt

    (m, k), n = a.shape, w.shape[1]
    check = sorted({0, m // 2, m - 1})
    t_cublas = _time_us(lambda: a @ w, reps)
    t_inv = _time_us(lambda: kt.matmul(a, w), reps)
    prompt = kt.prompt_sized(m, n, k)
    way = "one split" if kt.config(n, k)[1] == 1 else "partials"
    way = "splits in program" if prompt and way == "partials" else way
    row = [name, k, n, m, f"{t_cublas:.1f}", f"{t_inv:.1f}", f"{t_inv / t_cublas:.2f}x"]
    row += [f"{2 * m * n * k / t_inv / 1e6:.0f}", way, _bits(kt.matmul(a, w), a, w, check)]
    # the same product the decode way: K splits through float32 partials, decode tiles
    small = (kt.BLOCK_M, kt.config(n, k)[0], kt.NUM_WARPS, 4)
    row.append(f"{_time_us(lambda: kt.matmul(a, w, splits_in=False, tiles=small), reps):.1f}")
    times, bits = [], []
    for partials, t in tiles:
        if not prompt:
            times.append("")
            bits.append("")
            continue
        try:
            kw = dict(tiles=t, splits_in=partials != "p", tma=False if partials == "x" else None)
            times.append(f"{_time_us(lambda kw=kw: kt.matmul(a, w, **kw), reps):.1f}")
            bits.append(_bits(kt.matmul(a, w, **kw), a, w, check))
        except Exception as e:  # a tile that does not compile (shared memory) is a row's note
            times.append(type(e).__name__)
            bits.append("")
    return row + times + bits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--rows", default="1,16,2048,8192")
    ap.add_argument("--tiles", default="", help="block_m:block_n:warps:stages,... for prompt-sized rows "
                    "(a leading p: K splits added through partials; x: in the program, tiles read by pointer "
                    "loads, not TMA)")  # fmt: skip
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    names = [t for t in args.tiles.split(",") if t]
    tiles = [
        (t[0] if t[0].isalpha() else "", tuple(int(x) for x in t.lstrip("psfx").split(":"))) for t in names
    ]
    header = ["proj", "K", "N", "rows", "cuBLAS µs", "invariant µs", "inv / cuBLAS", "TFLOP/s", "way", "bits",
              "partials µs"] + [f"{t} µs" for t in names] + [f"{t} bits" for t in names]  # fmt: skip
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    for name, k, n in projections(args.shape):
        w = (torch.randn(k, n, device=dev, generator=g) / k**0.5).to(torch.bfloat16)
        for m in (int(r) for r in args.rows.split(",")):
            row = _row(
                name, w, torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16), tiles, args.reps
            )
            print("| " + " | ".join(str(x) for x in row) + " |", flush=True)


if __name__ == "__main__":
    main()
