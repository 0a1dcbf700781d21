"""Quality under constraint: on a fixed subset of benchmarks/quality (the embedded model,
greedy, deterministic mode so that the counts repeat), JSON Schema constraints with
whitespace="natural" get no fewer fields right than free text, and every constrained output is
valid and finished.
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
def test_natural_whitespace_constraint_is_no_worse_than_free_text(llm):
    bq = _load_bench()
    docs, schemas = bq.load_data()
    subset = [d for d in docs if d["id"] in IDS]
    assert len(subset) == len(IDS)
    free = bq.run_mode(llm, subset, "free", 0.0, 0, MAX_TOKENS, schemas)
    natural = bq.run_mode(llm, subset, "natural", 0.0, 0, MAX_TOKENS, schemas)
    right = {run.mode: sum(r["correct"] for r in run) for run in (free, natural)}
    assert right["natural"] >= right["free"], right
    assert all(r["valid"] and r["finished"] for r in natural), [r["text"] for r in natural]
