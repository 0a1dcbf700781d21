#!/usr/bin/env python
"""FlashInfer's sampling kernels as a peer of the fused sampler (bench_sampling.py --flashinfer).

FlashInfer (what vLLM samples with on CUDA) JIT-compiles its sampling module with nvcc. Its
wheel is too large to carry to a device, and its sampling kernels need only a few of its
headers, so this takes them out of the wheel once:

    pip download --no-deps flashinfer-python==0.7.4
    python benchmarks/flashinfer_peer.py --extract flashinfer_python-0.7.4-py3-none-any.whl

which writes ``include/flashinfer/`` (``sampling.cuh`` and the headers it includes) and
``cccl/`` (the CUB and libcu++ versions FlashInfer is built against) under
``benchmarks/.cache/flashinfer`` (``--dest``). On the CUDA machine ``load()`` builds
``flashinfer_sampling.cu`` against them with torch's extension builder (nvcc, ninja; a
minute or two the first time, cached in that folder's ``build/``).

The peer's call is vLLM's FlashInfer path: the bitmask applied to the logits (xgrammar's
kernel, or torch's masked_fill), FlashInfer's softmax, then its top-k / top-p / top-k + top-p
sampling from the probabilities (deterministic, a fixed seed).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DEST = os.path.join(HERE, ".cache", "flashinfer")
ENTRY = "flashinfer/sampling.cuh"
_INCLUDE = re.compile(rb'#include\s+[<"]([^>"]+)[>"]')


def header_closure(read, exists, entry: str = ENTRY) -> list[str]:
    """The headers ``entry`` includes, directly or not, that ``exists`` finds (paths relative to
    the include root; ``read(path)`` gives a header's bytes). System and CUDA headers, which
    ``exists`` does not find, are left to the compiler's own paths."""
    seen, todo = [], [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        for m in _INCLUDE.finditer(read(path)):
            name = m.group(1).decode()
            near = os.path.normpath(os.path.join(os.path.dirname(path), name))
            for cand in (near, name):
                if exists(cand):
                    todo.append(cand)
                    break
    return sorted(seen)


def extract(wheel: str, dest: str = DEFAULT_DEST) -> list[str]:
    """Copy the sampling headers' closure and the vendored CCCL out of a flashinfer-python wheel
    into ``dest``; returns the headers copied."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        inc = "flashinfer/data/include/"
        if inc + ENTRY not in names:
            raise SystemExit(f"{wheel}: no {inc + ENTRY} (not a flashinfer-python wheel with its sources?)")
        headers = header_closure(lambda p: z.read(inc + p), lambda p: inc + p in names)
        if os.path.isdir(dest):
            shutil.rmtree(dest)
        for h in headers:
            target = os.path.join(dest, "include", h)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(z.read(inc + h))
        cccl = "flashinfer/data/cccl/"
        for name in names:
            if name.startswith(cccl) and not name.endswith("/"):
                target = os.path.join(dest, "cccl", name[len(cccl) :])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(z.read(name))
    return headers


def load(dest: str = DEFAULT_DEST, verbose: bool = False):
    """The built extension (``softmax(logits, workspace)``, ``sample(probs, top_k, top_p, seed,
    offset)``), or SystemExit naming what is missing."""
    if not os.path.exists(os.path.join(dest, "include", ENTRY)):
        raise SystemExit(f"no FlashInfer headers under {dest}: run `python benchmarks/flashinfer_peer.py "
                         f"--extract WHEEL` first (see its docstring)")  # fmt: skip
    from torch.utils import cpp_extension

    cccl = [os.path.join(dest, "cccl", d) for d in ("cub", "libcudacxx/include", "thrust")]
    build = os.path.join(dest, "build")
    os.makedirs(build, exist_ok=True)
    return cpp_extension.load(
        name="deepinfer_bench_flashinfer_sampling",
        sources=[os.path.join(HERE, "flashinfer_sampling.cu")],
        extra_include_paths=[d for d in cccl if os.path.isdir(d)] + [os.path.join(dest, "include")],
        extra_cuda_cflags=["-O3", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a"],
        build_directory=build,
        verbose=verbose,
    )


class Sampler:
    """vLLM's FlashInfer path for one batch shape: mask, softmax, sample."""

    def __init__(self, mod, apply_mask) -> None:
        import torch

        self.mod, self.apply_mask = mod, apply_mask
        self.workspace = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")

    def __call__(self, x, bitmask, top_k: int, top_p: float):
        """x: float32 [B, V] logits, masked in place (masking again changes nothing)."""
        self.apply_mask(x, bitmask)
        return self.mod.sample(self.mod.softmax(x, self.workspace), top_k, top_p, 0, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--extract", metavar="WHEEL", help="a flashinfer-python wheel")
    ap.add_argument("--dest", default=DEFAULT_DEST)
    ap.add_argument("--build", action="store_true", help="build the extension now (CUDA machine)")
    args = ap.parse_args()
    if args.extract:
        headers = extract(args.extract, args.dest)
        print(f"{len(headers)} headers and CCCL written to {args.dest}: {', '.join(headers)}")
    if args.build:
        load(args.dest, verbose=True)
        print("built")


if __name__ == "__main__":
    main()
