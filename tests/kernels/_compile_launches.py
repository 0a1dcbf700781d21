"""Compile, for an sm_90 GPU, every Triton launch that ``sample_triton.sample`` and
``verify_triton.verify`` make, with the argument types they pass -- without a GPU (run as a
script, with TRITON_INTERPRET=0; ``test_sample_compile`` runs it).

The CPU tests run the kernels under the interpreter, which checks no types: a placeholder
buffer of another dtype (an all-greedy call passes the token buffer where no draw buffers
exist) reaches the compiled code only on a GPU. Here each launch is compiled instead of run:
the host code runs on CPU tensors, and every kernel object is swapped for one that builds the
signature from the arguments (tensor dtypes, ints, constexprs) and calls ``triton.compile``.

    python tests/kernels/_compile_launches.py   # prints the kernels it compiled
"""

from __future__ import annotations

import inspect
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from deepinfer.kernels import (  # noqa: E402
    DEFAULT_TUNING,
    SampleTuning,
    sample_greedy,
    sample_reference,
    sample_rows,
    sample_split,
    sample_triton,
    verify_triton,
)

TARGET = GPUTarget("cuda", 90, 32)
_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
          torch.int64: "i64", torch.bool: "i1"}  # fmt: skip
compiled: dict[tuple, str] = {}


class _Compile:
    """``kernel[grid](*args, **kw)`` compiles the kernel for TARGET with the types of args."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return self.launch

    def launch(self, *args, **kw):
        names = list(inspect.signature(self.kernel.fn).parameters)
        consts = {k: v for k, v in kw.items() if k in names}
        sig = {}
        for name, a in zip(names, args):
            if isinstance(a, torch.Tensor):
                sig[name] = "*" + _TYPES[a.dtype]
            elif isinstance(a, bool):
                sig[name] = "i1"
            elif isinstance(a, int):
                sig[name] = "i32" if -(2**31) <= a < 2**31 else "i64"
            else:
                sig[name] = "fp32"
        sig.update(dict.fromkeys(consts, "constexpr"))
        warps = kw.get("num_warps", 4)
        key = (self.kernel.fn.__name__, tuple(sorted(sig.items())), tuple(sorted(consts.items())), warps)
        if key not in compiled:
            triton.compile(ASTSource(self.kernel, sig, consts), target=TARGET,
                           options={"num_warps": warps, "enable_fp_fusion": False})  # fmt: skip
            compiled[key] = self.kernel.fn.__name__


def _sample(B: int, V: int, dtype: torch.dtype, kinds: str, logprobs: bool, masked: bool,
            tuning: SampleTuning = DEFAULT_TUNING) -> None:  # fmt: skip
    logits = torch.zeros(B, V, dtype=dtype)
    bitmask = torch.zeros(B, (V + 31) // 32, dtype=torch.int32) if masked else None
    indices = torch.tensor([0]) if masked else None
    f32 = torch.zeros(B)
    i64 = torch.zeros(B, dtype=torch.int64)
    sample_triton.sample(logits, bitmask, indices, f32, i64, f32, f32, i64, i64, return_logprobs=logprobs,
                         kinds=kinds, tuning=tuning)  # fmt: skip


def main() -> None:
    for module, name in ((sample_split, "_split_pass1_kernel"), (sample_greedy, "_split_greedy_kernel"),
                         (sample_split, "_split_draw_kernel"), (sample_split, "_split_plain_kernel"),
                         (sample_split, "_split_pass2_kernel"), (sample_rows, "_sample_kernel"),
                         (verify_triton, "_verify_kernel")):  # fmt: skip
        setattr(module, name, _Compile(getattr(module, name)))
    sample_triton.pdl_device = lambda dev: True  # the Hopper launches (gdc_wait / gdc_launch_dependents)
    V = sample_reference.CHUNK_MAX + 100  # two chunks: the split kernels
    for kinds in sample_reference.KINDS:
        for logprobs in (False, True):
            _sample(3, V, torch.float32, kinds, logprobs, masked=True)
    _sample(3, V, torch.bfloat16, "greedy", False, masked=True)  # the packed keys, two tiles a program
    for split2 in (False, True):  # the test pass in the per-row kernel, 2-byte logits
        _sample(3, V, torch.bfloat16, "filter", False, masked=False, tuning=SampleTuning(split2=split2))
    _sample(3, 1000, torch.float32, "filter", True, masked=True)  # one chunk: the per-row kernel alone
    B, K = 2, 3
    z = torch.zeros(B, dtype=torch.int64)
    verify_triton.verify(torch.zeros(B, K + 1, V), torch.zeros(B, K, dtype=torch.int64), z, None, None,
                         torch.zeros(B), z, torch.ones(B), torch.zeros(B), z, z)  # fmt: skip
    for key, name in compiled.items():
        print(name, dict(key[2]))
    print(f"{len(compiled)} kernels compiled for sm_90")


if __name__ == "__main__":
    sys.exit(main())
