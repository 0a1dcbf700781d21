"""Data shared with other projects (the JSON Schema Test Suite, MaskBench's schemas): found
only through the environment variable ``DEEPINFER_SHARED_DATA``, a folder holding
``json-schema-test-suite/`` and ``maskbench-dev/``. Tests that need it skip, saying why,
when it is unset or the data is not there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "DEEPINFER_SHARED_DATA"


def shared_path(*parts: str) -> Path | None:
    """``$DEEPINFER_SHARED_DATA/<parts>``, or None when the variable is unset."""
    root = os.environ.get(ENV)
    return Path(root, *parts) if root else None


def need_shared(*parts: str) -> Path:
    """The shared path, or skip the test (the variable unset, or no such file/folder)."""
    path = shared_path(*parts)
    if path is None:
        pytest.skip(f"{'/'.join(parts)}: shared data not configured (set {ENV} to the folder holding it)")
    if not path.exists():
        pytest.skip(f"{path} not found (check {ENV})")
    return path
