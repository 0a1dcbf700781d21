"""Quality under constraint: on a fixed subset of benchmarks/quality (the embedded model,
greedy, deterministic mode so that the counts repeat), JSON Schema constraints in the default
mode get no fewer fields right than free text, and every constrained output is valid and
finished; so does examples/extract.py with its own prompt.
Counts, not times (benchmarks/bench_quality.py measures the whole set)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IDS = ("person-01", "person-04", "person-07", "event-02", "event-05", "product-03")
MAX_TOKENS = 160


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_quality", ROOT / "benchmarks" / "bench_quality.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def llm(embedded_gguf_path):
    from deepinfer import LLM

    return LLM(embedded_gguf_path, deterministic=True, max_num_seqs=8)


@pytest.mark.slow
def test_default_constraint_is_no_worse_than_free_text(llm):
    from deepinfer import SamplingParams

    assert SamplingParams().whitespace == "flexible"  # the default these counts were set for
    bq = _load_bench()
    docs, schemas = bq.load_data()
    subset = [d for d in docs if d["id"] in IDS]
    assert len(subset) == len(IDS)
    runs = [bq.run_mode(llm, subset, m, 0.0, 0, MAX_TOKENS, schemas) for m in ("free", "default", "extract")]
    right = {run.mode: sum(r["correct"] for r in run) for run in runs}
    assert right["default"] >= right["free"] and right["extract"] >= right["free"], right
    for run in runs[1:]:
        assert all(r["valid"] and r["finished"] for r in run), [r["text"] for r in run]
