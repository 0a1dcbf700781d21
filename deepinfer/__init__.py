"""DeepInfer: structured-generation LLM inference.

The package root is lazy: `import deepinfer.constraints` must not import torch, so the engine
classes load on first attribute access.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# Before any submodule can import torch (see deepinfer/_threads.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
__all__ = ["LLM", "RequestOutput", "SamplingParams"]

_EXPORTS = {
    "LLM": "deepinfer.llm",
    "SamplingParams": "deepinfer.sampling_params",
    "RequestOutput": "deepinfer.outputs",
}

if TYPE_CHECKING:
    from .llm import LLM
    from .outputs import RequestOutput
    from .sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'deepinfer' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
