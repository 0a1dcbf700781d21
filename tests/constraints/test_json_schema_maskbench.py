"""Real-world schemas (MaskBench dev sample of JSONSchemaBench) through the front end.

Byte level: each schema that compiles (``lenient=False``) gives an automaton; its valid
instances (``json.dumps`` compact, ``ensure_ascii=False``) should be accepted and invalid
ones rejected. Valid instances whose keys are not in schema order are rejected by design
(objects are generated in schema order), so they are re-serialized in schema order first
where the schema is a plain object. Run as a script for the full table::

    python tests/constraints/test_json_schema_maskbench.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SHARED = Path(os.environ.get("DEEPINFER_SHARED_DATA", REPO.parent / "shared" / "data"))
BENCH = SHARED / "maskbench-dev"

# floors from the last full run (raise them as coverage grows; a drop is a regression)
MIN_COMPILED = 230
MAX_FALSE_ACCEPTANCES = 0
MIN_VALID_ACCEPTED_RATE = 0.85


def run(files: list[Path], *, lenient: bool = False) -> dict:
    from deepinfer.constraints.automaton import compile_grammar
    from deepinfer.constraints.errors import ConstraintError
    from deepinfer.constraints.json_schema import schema_to_grammar

    out = {"schemas": 0, "compiled": 0, "valid": 0, "valid_accepted": 0, "invalid": 0, "invalid_rejected": 0,
           "errors": {}, "false_acceptances": [], "false_rejections": [], "compile_s": []}
    for path in files:
        case = json.loads(path.read_text())
        out["schemas"] += 1
        t0 = time.perf_counter()
        try:
            automaton = compile_grammar(schema_to_grammar(case["schema"], lenient=lenient))
        except ConstraintError as e:
            out["errors"][path.name] = f"{type(e).__name__}: {e}"[:160]
            continue
        except RecursionError:
            out["errors"][path.name] = "RecursionError"
            continue
        out["compile_s"].append(time.perf_counter() - t0)
        out["compiled"] += 1
        for test in case["tests"]:
            text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False).encode()
            got = automaton.accepts(text)
            if test["valid"]:
                out["valid"] += 1
                out["valid_accepted"] += got
                if not got:
                    out["false_rejections"].append(path.name)
            else:
                out["invalid"] += 1
                out["invalid_rejected"] += not got
                if got:
                    out["false_acceptances"].append(f"{path.name}: {test.get('description', '')}")
    return out


def bench_files() -> list[Path]:
    return sorted(p for p in BENCH.glob("*.json"))


@pytest.fixture(scope="module")
def results() -> dict:
    if not BENCH.is_dir():
        pytest.skip(f"maskbench-dev not found at {BENCH} (set DEEPINFER_SHARED_DATA)")
    if not os.environ.get("DEEPINFER_MASKBENCH"):
        pytest.skip("slow: some large schemas take 10-30 s to lower and determinize; set DEEPINFER_MASKBENCH=1")
    return run(bench_files())


def test_maskbench_compiles_enough(results: dict) -> None:
    assert results["compiled"] >= MIN_COMPILED, results["errors"]


def test_maskbench_sound(results: dict) -> None:
    assert len(results["false_acceptances"]) <= MAX_FALSE_ACCEPTANCES, results["false_acceptances"]


def test_maskbench_valid_accepted(results: dict) -> None:
    assert results["valid_accepted"] >= MIN_VALID_ACCEPTED_RATE * results["valid"], results["false_rejections"]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    for lenient in (False, True):
        r = run(bench_files(), lenient=lenient)
        cs = sorted(r.pop("compile_s"))
        print(f"lenient={lenient}: compiled {r['compiled']}/{r['schemas']}, valid accepted "
              f"{r['valid_accepted']}/{r['valid']}, invalid rejected {r['invalid_rejected']}/{r['invalid']}, "
              f"compile p50 {cs[len(cs) // 2] * 1e3:.1f} ms, max {cs[-1] * 1e3:.0f} ms")
        if "-v" in sys.argv:
            print(json.dumps({k: r[k] for k in ("errors", "false_acceptances", "false_rejections")}, indent=1))
