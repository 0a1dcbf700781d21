"""Every Triton launch that sample() and verify() make compiles for an sm_90 GPU with the
argument types they pass (_compile_launches.py, run with TRITON_INTERPRET=0 in a subprocess):
the interpreter that runs the other CPU tests checks no types, so a placeholder buffer of
another dtype would otherwise first fail on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_every_launch_compiles_for_sm90():
    pytest.importorskip("triton.backends.nvidia", reason="Triton without its CUDA backend (ptxas)")
    script = Path(__file__).with_name("_compile_launches.py")
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "kernels compiled for sm_90" in done.stdout
    for kernel in ("_split_plain_kernel", "_split_pass2_kernel", "_sample_kernel", "_verify_kernel"):
        assert kernel in done.stdout, done.stdout
