"""examples/extract.py on the embedded model: every row written and validated, failed rows
kept with their error, interrupted runs (an early stop, a SIGKILL, a torn last line) resumed
without lost or repeated rows, bad schemas refused before any generation."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from deepinfer import LLM

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample_data"
SCHEMA = json.loads((SAMPLE / "schema.json").read_text())
IDS = ["a1", "a2", "a3", "a4", "a5", "a6"]


def _load_extract():
    spec = importlib.util.spec_from_file_location("extract_example", ROOT / "examples" / "extract.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


extract = _load_extract()


@pytest.fixture(scope="module")
def llm(embedded_gguf_path):
    return LLM(seed=0)


def run(llm, tmp_path, *extra, schema=SAMPLE / "schema.json", input=SAMPLE / "docs.jsonl", out="out.jsonl"):
    argv = [
        "--schema",
        str(schema),
        "--input",
        str(input),
        "--output",
        str(tmp_path / out),
        "--max-tokens",
        "96",
        "--no-progress",
        *map(str, extra),
    ]
    return extract.main(argv, llm=llm)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_row(r: dict) -> None:
    """An output row is well formed: ok rows hold data valid under the schema; failed rows
    hold an error and no data."""
    assert set(r) >= {"id", "ok", "data", "error", "finish_reason"}
    if r["ok"]:
        jsonschema.validate(r["data"], SCHEMA)
        assert r["error"] is None and r["finish_reason"] == "stop"
    else:
        assert r["data"] is None and r["error"]


def test_all_rows_written_and_validated(llm, tmp_path):
    assert run(llm, tmp_path, "--batch-size", 4) == 0
    out = rows(tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == IDS
    for r in out:
        check_row(r)
    # bounded schema, max_tokens with room: every row should succeed
    assert all(r["ok"] for r in out), [r for r in out if not r["ok"]]
    assert run(llm, tmp_path) == 0  # a second run has nothing left to do
    assert rows(tmp_path / "out.jsonl") == out


def test_stopped_run_resumes_with_the_rest(llm, tmp_path):
    """--stop-after 1 ends the run (exit 3) after the first batch; re-running writes exactly
    the remaining rows. The schema comes from a pydantic model this time."""
    model = f"{SAMPLE / 'person.py'}:Person"
    assert run(llm, tmp_path, "--batch-size", 2, "--stop-after", 1, schema=model) == 3
    first = rows(tmp_path / "out.jsonl")
    assert [r["id"] for r in first] == IDS[:2]
    assert run(llm, tmp_path, "--batch-size", 3, "--limit", 1, schema=model) == 0
    assert [r["id"] for r in rows(tmp_path / "out.jsonl")] == IDS[:3]
    assert run(llm, tmp_path, "--batch-size", 3, schema=model) == 0
    out = rows(tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == IDS and out[:2] == first
    for r in out:
        check_row(r)


def test_killed_process_resumes(llm, tmp_path):
    """A real crash: SIGKILL the script once its first batch is on disk, then resume."""
    out = tmp_path / "out.jsonl"
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "extract.py"),
        "--schema",
        str(SAMPLE / "schema.json"),
        "--input",
        str(SAMPLE / "docs.jsonl"),
        "--output",
        str(out),
        "--batch-size",
        "1",
        "--max-tokens",
        "96",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_text().count("\n") >= 1):
            assert proc.poll() is None, f"extract.py exited early: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no batch written in 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")]
    assert 1 <= len(before) < len(IDS), "the kill came too late to interrupt anything"
    assert run(llm, tmp_path, "--batch-size", 4) == 0
    after = rows(out)
    assert [r["id"] for r in after] == IDS and after[: len(before)] == before
    for r in after:
        check_row(r)


def test_torn_last_line_is_repaired(llm, tmp_path, capsys):
    assert run(llm, tmp_path, "--limit", 2) == 0
    path = tmp_path / "out.jsonl"
    kept = path.read_text()
    with open(path, "a") as fh:
        fh.write('{"id": "a3", "ok": tr')  # a crash in the middle of a write
    assert run(llm, tmp_path, "--batch-size", 4) == 0
    assert "dropping a truncated last line" in capsys.readouterr().err
    assert path.read_text().startswith(kept)
    assert [r["id"] for r in rows(path)] == IDS


def test_done_ids_repairs_only_the_last_line(tmp_path):
    """No model: the resume scan keeps a complete row that lost its newline, cuts a torn
    one, and refuses a broken line that is not the last."""
    p = tmp_path / "o.jsonl"
    p.write_text('{"id": 1, "ok": true}\n{"id": "x", "ok": false}')
    assert extract.done_ids(str(p)) == {"1", '"x"'}
    assert p.read_text() == '{"id": 1, "ok": true}\n{"id": "x", "ok": false}\n'
    p.write_text('{"id": 1, "ok": true}\n{"id": 2, "o\n\n')
    assert extract.done_ids(str(p)) == {"1"} and p.read_text() == '{"id": 1, "ok": true}\n'
    p.write_text('{"id": 1}\ngarbage\n{"id": 3}\n')
    with pytest.raises(extract.UsageError, match=r"o.jsonl: line 2 is not an output row"):
        extract.done_ids(str(p))
    assert extract.done_ids(str(tmp_path / "missing.jsonl")) == set()


def test_bad_input_rows_become_failed_rows(llm, tmp_path):
    lines = [
        '{"id": "ok1", "text": "Ann Lee, 30, lives in Rome."}',
        "{this is not json",
        '{"id": "nofield", "body": "Bob, 40, Paris."}',
        '{"text": 12}',
        "[1, 2]",
        "",
        '{"id": "long", "text": "' + "word " * 9000 + '"}',  # longer than the 8192-token context
        '{"id": "ok2", "text": "Cy Berg is 50 and lives in Oslo."}',
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    assert run(llm, tmp_path, "--batch-size", 8, input=src) == 0
    out = {r["id"]: r for r in rows(tmp_path / "out.jsonl")}
    assert list(out) == ["ok1", 2, "nofield", 4, 5, "long", "ok2"]  # blank line 6 is no row
    for r in out.values():
        check_row(r)
    assert out["ok1"]["ok"] and out["ok2"]["ok"]
    assert out[2]["error"].startswith("input line 2: not valid JSON")
    assert out["nofield"]["error"] == "input line 3: no 'text' field"
    assert out[4]["error"] == "input line 4: the 'text' field is 12, not a string"
    assert out[5]["error"] == "input line 5: expected a JSON object, got list"
    assert out["long"]["error"].startswith("input line 7:") and "context is 8192" in out["long"]["error"]
    assert out["long"]["finish_reason"] == "error"


BAD_SCHEMAS = [
    ("bad.json", '{"type": "object",', r"schema file .*bad.json: not valid JSON: .* at line 1, column 19"),
    (
        "bad.json",
        '{"type": "object", "properties": {"a": {"type": "strin"}}}',
        r"schema file .*bad.json: not a valid JSON Schema at /properties/a/type: 'strin'",
    ),
    ("bad.json", "[1]", r"schema file .*bad.json: a JSON Schema is an object or a bool, got list"),
    (
        "bad.json",
        '{"properties": {"a": {"pattern": "(?<=x)y"}}}',
        r"schema .*bad.json: the engine cannot enforce it: .*lookbehind.*#/properties/a/pattern",
    ),
    ("missing.json", None, r"schema file .*missing.json: cannot read it: No such file"),
    ("person.py:Nobody", None, r"module .*person.py' has no attribute 'Nobody'"),
    ("no_such_module:Model", None, r"cannot import 'no_such_module': ModuleNotFoundError"),
]


@pytest.mark.parametrize(
    "name, text, message",
    BAD_SCHEMAS,
    ids=[
        "not-json",
        "not-a-schema",
        "not-an-object",
        "unenforceable",
        "missing-file",
        "missing-model",
        "missing-module",
    ],
)
def test_bad_schema_is_refused_before_generation(llm, tmp_path, capsys, name, text, message):
    import re

    if text is not None:
        (tmp_path / name).write_text(text)
    schema = tmp_path / name if name.endswith(".json") else name
    if name.startswith("person.py"):
        schema = f"{SAMPLE / 'person.py'}:Nobody"
    assert run(llm, tmp_path, schema=schema) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "out.jsonl").exists()


def test_duplicate_ids_are_refused(llm, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n{"id": 1, "text": "c"}\n')
    assert run(llm, tmp_path, input=src) == 2
    assert "line 3 repeats id 1 of line 1" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_cli_help_runs_without_the_model():
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "extract.py"), "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0 and "--stop-after" in r.stdout
