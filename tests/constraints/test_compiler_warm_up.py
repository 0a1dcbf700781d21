"""The compiler's warm-up: the first ``Compiler`` of a process on a cold numba cache compiles
every automaton kernel (tens of seconds on 2 cores). That is not a grammar's compile time: no
request's deadline (``Limits.max_seconds``) applies to it, so it cannot fail."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_first_compiler_on_a_cold_kernel_cache_compiles(tmp_path):
    code = textwrap.dedent(
        """
        from deepinfer.constraints import Compiler
        from deepinfer.constraints.automaton.nfa import Limits
        from tests.constraints.vocabs import small_vocab

        # a deadline no cold kernel compilation meets: only the grammar's own time may count
        c = Compiler(small_vocab(), limits=Limits(max_seconds=2.0))
        c.json_schema({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
        print("ok")
        """
    )
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PATH": "/usr/bin:/bin", "DEEPINFER_KERNELS": "jit"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
