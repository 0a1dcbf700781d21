"""Bad arguments are refused with a ValueError that names the argument."""

from __future__ import annotations

import pytest
import torch

from deepinfer import kernels

V = 70
LOGITS = torch.zeros(2, V)
OK = dict(temperature=1.0, seed=0, step=0)
BAD = [  # (id, logits, kwargs, message)
    (
        "bitmask-dtype",
        LOGITS,
        dict(bitmask=torch.zeros(2, 3, dtype=torch.int64)),
        r"bitmask must have dtype torch\.int32",
    ),
    (
        "bitmask-shape",
        LOGITS,
        dict(bitmask=torch.zeros(2, 2, dtype=torch.int32)),
        r"bitmask must have shape .*\[2, 3\]",
    ),
    ("bitmask-rows", LOGITS, dict(bitmask=torch.zeros(1, 3, dtype=torch.int32)), r"bitmask must have shape"),
    ("temperature-negative", LOGITS, dict(temperature=-0.5), r"temperature must be finite and >= 0"),
    ("temperature-nan", LOGITS, dict(temperature=float("nan")), r"temperature must be finite"),
    (
        "temperature-shape",
        LOGITS,
        dict(temperature=torch.ones(3)),
        r"temperature must be a scalar or have shape \[2\]",
    ),
    ("top_k-negative", LOGITS, dict(top_k=-1), r"top_k must be >= 0"),
    ("top_k-float", LOGITS, dict(top_k=2.5), r"top_k must be integers"),
    ("top_p-zero", LOGITS, dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    ("top_p-big", LOGITS, dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    ("min_p", LOGITS, dict(min_p=-0.1), r"min_p must be in \[0, 1\]"),
    ("seed-float", LOGITS, dict(seed=1.5), r"seed must be integers"),
    ("logits-1d", torch.zeros(V), {}, r"logits must be a 2-D tensor"),
    ("logits-int", torch.zeros(2, V, dtype=torch.int32), {}, r"logits must be float32, bfloat16 or float16"),
    ("indices-no-mask", LOGITS, dict(indices=[0]), r"indices given without a bitmask"),
    (
        "indices-range",
        LOGITS,
        dict(bitmask=torch.zeros(2, 3, dtype=torch.int32), indices=[2]),
        r"indices must be row ids in \[0, 2\)",
    ),
    ("backend", LOGITS, dict(backend="cuda"), r"backend must be one of"),
]


@pytest.mark.parametrize("logits,kwargs,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_sample_rejects(logits, kwargs, message):
    with pytest.raises(ValueError, match=message):
        kernels.sample(logits, **{**OK, **kwargs})


def test_apply_bitmask_rejects():
    with pytest.raises(ValueError, match=r"bitmask must have dtype torch\.int32"):
        kernels.apply_bitmask_(LOGITS.clone(), torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"bitmask must have shape"):
        kernels.apply_bitmask_(LOGITS.clone(), torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"indices must be a 1-D integer sequence"):
        kernels.apply_bitmask_(LOGITS.clone(), torch.zeros(2, 3, dtype=torch.int32), [[0]])


def test_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"backend='triton' needs CUDA tensors or TRITON_INTERPRET=1"):
        kernels.sample(LOGITS, backend="triton", **OK)
