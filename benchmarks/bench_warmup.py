"""The warm-up's compile phase on a machine that has compiled nothing yet: the fused sampler's
and the verify kernel's variants (``deepinfer/warmup.py``: ``sampling_calls``,
``verify_calls``), one after another against on threads at once. Prints a table, asserts
nothing.

    python benchmarks/bench_warmup.py [--vocab 49152,128256] [--threads 0] [--first N]

Each cell runs in a new process with an empty Triton cache of its own (``TRITON_CACHE_DIR``),
so every variant compiles: "in turn" is ``run_calls(..., workers=1)``, "threads" the
warm-up's default (``compile_workers()``: one a usable core, at most 32) or ``--threads``.
``--first N`` times only the first N variants (the sequential column is the slow one). The
last column launches every variant again in the same process, compiled: what a step pays.
Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench_decode import _table

_CHILD = """
import json, os, sys, time
import torch
from deepinfer.warmup import compile_workers, run_calls, sampling_calls, verify_calls
V, first, workers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dev = torch.device("cuda")
torch.zeros(1, device=dev)  # the CUDA context, outside the clock
calls = sampling_calls(V, dev) + verify_calls(V, dev)
calls = calls[:first] if first else calls
workers = workers or compile_workers()
t = time.perf_counter()
run_calls(calls, dev, workers)
cold = time.perf_counter() - t
t = time.perf_counter()
run_calls(calls, dev, 1)
hot = time.perf_counter() - t
print(json.dumps(dict(calls=len(calls), workers=workers, cold=cold, hot=hot)))
"""


def _cell(vocab: int, first: int, workers: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache, TRITON_INTERPRET="0")
        out = subprocess.run([sys.executable, "-c", _CHILD, str(vocab), str(first), str(workers)],
                             capture_output=True, text=True, env=env)  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"vocabulary {vocab}, workers {workers}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", default="49152,128256", help="vocabulary sizes (SmolLM2, Llama 3)")
    ap.add_argument("--threads", type=int, default=0, help="compile threads (0: the warm-up's default)")
    ap.add_argument("--first", type=int, default=0, help="only the first N variants (0: all)")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_warmup needs CUDA: the compiles it times are Triton's for the device")
    rows = []
    for vocab in [int(v) for v in args.vocab.split(",")]:
        seq = _cell(vocab, args.first, 1)
        thr = _cell(vocab, args.first, args.threads)
        rows.append([vocab, seq["calls"], f"{seq['cold']:.1f}", thr["workers"], f"{thr['cold']:.1f}",
                     f"{seq['cold'] / thr['cold']:.2f}x", f"{thr['hot'] * 1e3:.1f}"])  # fmt: skip
    print(f"{torch.cuda.get_device_name()}; {os.cpu_count()} CPUs; empty Triton cache per cell")
    _table(["vocabulary", "variants", "in turn [s]", "threads", "on threads [s]", "speed-up",
            "again, compiled [ms]"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
