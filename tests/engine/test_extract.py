"""examples/extract.py on the embedded model: every row written and validated, failed rows
kept with their error, interrupted runs (an early stop, a SIGKILL, a torn last line) resumed
without lost or repeated rows, bad schemas refused before any generation. Poison rows (not
UTF-8, lone surrogates, bad or repeated ids, over-long lines) become error rows exactly once
and re-runs skip them; a missing output folder and a locked output fail before the model
loads. (tests/engine/test_extract_fuzz.py: the same, property-based.)"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
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
    assert extract.done_ids(str(p)) == Counter({"1": 1, '"x"': 1})
    assert p.read_text() == '{"id": 1, "ok": true}\n{"id": "x", "ok": false}\n'
    p.write_text('{"id": 1, "ok": true}\n{"id": 2, "o\n\n')
    assert extract.done_ids(str(p)) == Counter({"1": 1}) and p.read_text() == '{"id": 1, "ok": true}\n'
    p.write_text('{"id": 1}\n{"id": 1}\n{"id": "\\ud800"}\n')  # a repeated id counts twice
    assert extract.done_ids(str(p)) == Counter({"1": 2, '"\\ud800"': 1})
    p.write_text('{"id": 1}\ngarbage\n{"id": 3}\n')
    with pytest.raises(extract.UsageError, match=r"o.jsonl: line 2 is not an output row"):
        extract.done_ids(str(p))
    assert extract.done_ids(str(tmp_path / "missing.jsonl")) == Counter()


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


# -- poison rows: every input row exactly once, the run goes on, re-runs skip them -----------------
OK_LINE = b'{"id": "ok", "text": "Ann Lee, 30, lives in Rome."}'


def run_lines(llm, tmp_path, lines: list[bytes], *extra, out="out.jsonl"):
    """Write ``lines`` (bytes, newline-joined) as the input and run; the exit status."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    return run(llm, tmp_path, *extra, input=src, out=out)


def check_exactly_once(lines: list[bytes], out_path: Path) -> list[dict]:
    """Every output line is JSON (and UTF-8); each non-blank input line has exactly one
    output row, in input order; the rows are well formed. Returns them."""
    out = [json.loads(line) for line in out_path.read_bytes().decode("utf-8").splitlines()]
    assert [r["line"] for r in out] == [i for i, raw in enumerate(lines, 1) if raw.strip()]
    for r in out:
        check_row(r)
    return out


def check_rerun_skips(llm, tmp_path, lines: list[bytes], *extra) -> None:
    """A second run writes nothing: every row, failed ones included, is done."""
    before = (tmp_path / "out.jsonl").read_bytes()
    assert run_lines(llm, tmp_path, lines, *extra) == 0
    assert (tmp_path / "out.jsonl").read_bytes() == before


def test_missing_output_folder_fails_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import deepinfer

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(deepinfer, "LLM", no_model)
    out = tmp_path / "no" / "such" / "folder" / "out.jsonl"
    argv = ["--schema", str(SAMPLE / "schema.json"), "--input", str(SAMPLE / "docs.jsonl")]
    assert extract.main([*argv, "--output", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--output {out}: folder {out.parent} does not exist" in err
    assert not out.parent.exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--output", "{tmp}"], "--output {tmp}: is a folder"),
        (["--output", "{input}"], "--output {input} is the --input file"),
        (["--input", "{tmp}"], "--input {tmp}: not a regular file"),
        (["--max-tokens", "0"], "max_tokens must be a positive int"),
        (["--limit", "-1"], "--limit must be >= 0, got -1"),
        (["--stop-after", "0"], "--stop-after must be >= 1, got 0"),
        (["--max-line-bytes", "0"], "--max-line-bytes must be >= 1, got 0"),
    ],
    ids=[
        "output-folder",
        "output-is-input",
        "input-folder",
        "max-tokens",
        "limit",
        "stop-after",
        "line-bytes",
    ],
)
def test_bad_arguments_fail_before_the_model_loads(tmp_path, capsys, monkeypatch, extra, message):
    import deepinfer

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(deepinfer, "LLM", no_model)
    src = tmp_path / "in.jsonl"
    src.write_bytes(OK_LINE + b"\n")
    argv = [
        "--schema",
        str(SAMPLE / "schema.json"),
        "--input",
        str(src),
        "--output",
        str(tmp_path / "o.jsonl"),
    ]
    fill = {"tmp": str(tmp_path), "input": str(src)}
    assert extract.main([*argv, *(a.format(**fill) for a in extra), "--no-progress"]) == 2
    assert message.format(**fill) in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists() and src.read_bytes() == OK_LINE + b"\n"


def test_line_not_utf8_is_an_error_row(llm, tmp_path):
    lines = [
        '{"id": "cafe", "text": "Café Lopez, 34"}'.encode("latin-1"),  # é as one byte
        OK_LINE,
        b"\xff\xfe{garbage",
        b'{"id": "cesu", "text": "\xed\xa0\x80"}',  # a surrogate encoded in UTF-8: invalid
    ]
    assert run_lines(llm, tmp_path, lines) == 0
    out = check_exactly_once(lines, tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == [1, "ok", 3, 4]  # no id could be read: the line number
    assert out[0]["error"] == "input line 1: not valid UTF-8 at byte offset 27 (invalid continuation byte)"
    assert out[1]["ok"]
    assert out[2]["error"] == "input line 3: not valid UTF-8 at byte offset 0 (invalid start byte)"
    assert out[3]["error"].startswith("input line 4: not valid UTF-8 at byte offset 24")
    check_rerun_skips(llm, tmp_path, lines)


def test_lone_surrogates_are_error_rows_that_resume(llm, tmp_path):
    """JSON "\\ud800" in an id or a text decodes to a str that is not Unicode text: an error
    row, written with ASCII escapes so that it is valid UTF-8 and reads back to the same id."""
    lines = [
        rb'{"id": "\ud800", "text": "Ann, 30, Rome"}',
        rb'{"id": "t\udfff", "text": "x"}',
        rb'{"id": "txt", "text": "Bob \udc00 Lee, 40, Paris"}',
        rb'{"text": ["\ud800"]}',  # not a string: the message shows it escaped
        rb'{"id": "pair \ud83d\ude00", "text": "Cy Berg is 50 and lives in Oslo."}',  # a valid pair
    ]
    assert run_lines(llm, tmp_path, lines) == 0
    out = check_exactly_once(lines, tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == ["\ud800", "t\udfff", "txt", 4, "pair \U0001f600"]
    assert out[0]["error"] == (
        "input line 1: the 'id' field holds a lone surrogate ('\\ud800' at character 0): not Unicode text"
    )
    assert out[1]["error"].startswith("input line 2: the 'id' field holds a lone surrogate ('\\udfff' at")
    assert out[2]["error"] == (
        "input line 3: the 'text' field holds a lone surrogate ('\\udc00' at character 4): not Unicode text"
    )
    assert out[3]["error"] == "input line 4: the 'text' field is [\"\\ud800\"], not a string"
    assert out[4]["finish_reason"] is not None  # processed (ok, or a failure of the model's)
    raw = (tmp_path / "out.jsonl").read_bytes().splitlines()
    assert raw[0].startswith(rb'{"id": "\ud800", "line": 1,') and raw[4].startswith(
        '{"id": "pair \U0001f600"'.encode()
    )  # escaped where it must be, UTF-8 elsewhere
    check_rerun_skips(llm, tmp_path, lines)


def test_second_run_on_a_locked_output_exits_2(llm, tmp_path, capsys):
    import fcntl

    lines = [OK_LINE, b'{"id": "two", "text": "Bob, 40, Paris"}']
    assert run_lines(llm, tmp_path, lines, "--limit", 1) == 0
    path = tmp_path / "out.jsonl"
    before = path.read_bytes()
    with open(path, "ab") as other:  # another run, mid-way
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert run_lines(llm, tmp_path, lines) == 2
        assert f"--output {path}: another run holds the lock on it" in capsys.readouterr().err
        assert path.read_bytes() == before
        assert run_lines(llm, tmp_path, lines, out="other.jsonl") == 0  # other files are free
    assert run_lines(llm, tmp_path, lines) == 0  # released: the run finishes the rest
    assert [r["id"] for r in check_exactly_once(lines, path)] == ["ok", "two"]


def test_ids_that_are_not_strings_or_integers(llm, tmp_path):
    """A float, bool, null, list or object id: an error row whose id is the line number. Such
    a stand-in id claims nothing: a later row with that number as its id is still processed,
    and a re-run counts both rows."""
    lines = [
        b'{"id": 1.5, "text": "x"}',
        b'{"id": true, "text": "x"}',
        b'{"id": null, "text": "x"}',
        b'{"id": [1], "text": "x"}',
        b'{"id": {"a": 1}, "text": "x"}',
        b'{"id": 1e400, "text": "x"}',
        b'{"id": 2, "text": "Ann Lee, 30, lives in Rome."}',  # the number of line 2's stand-in id
    ]
    assert run_lines(llm, tmp_path, lines, "--limit", 6) == 0  # an interrupted run...
    assert run_lines(llm, tmp_path, lines) == 0  # ...resumed: line 7 is not taken for line 2
    out = check_exactly_once(lines, tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == [1, 2, 3, 4, 5, 6, 2]
    shown = ["1.5", "true", "null", "[1]", '{"a": 1}', "Infinity"]
    for i, s in enumerate(shown):
        assert out[i]["error"] == f"input line {i + 1}: the 'id' field is {s}, not a string or an integer"
    assert out[6]["ok"]
    check_rerun_skips(llm, tmp_path, lines)


def test_repeated_ids_after_the_first_are_error_rows(llm, tmp_path):
    lines = [
        b'{"id": 1, "text": "Ann Lee, 30, lives in Rome."}',
        b'{"id": "1", "text": "Bob, 40, Paris"}',  # "1" is not 1
        b'{"id": 1, "text": "c"}',
        b'{"text": "no id: line 4 is the id"}',
        b'{"id": 4, "text": "d"}',
    ]
    assert run_lines(llm, tmp_path, lines, "--limit", 2) == 0
    assert run_lines(llm, tmp_path, lines) == 0  # resumed: the repeats come after their first
    out = check_exactly_once(lines, tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == [1, "1", 1, 4, 4]
    assert out[2]["error"] == (
        "input line 3: id 1 repeats the id of line 1; ids must be unique (--id-field names them)"
    )
    assert out[4]["error"].startswith("input line 5: id 4 repeats the id of line 4;")
    assert out[0]["ok"] and out[2]["data"] is None and out[4]["data"] is None
    check_rerun_skips(llm, tmp_path, lines)


def test_long_lines_and_blank_lines(llm, tmp_path):
    """A line over --max-line-bytes is an error row; blank lines are no rows; CRLF is fine."""
    lines = [
        b"",
        b'{"id": "big", "text": "' + b"x" * 5000 + b'"}',
        b"   \t\r",
        b'{"id": "crlf", "text": "Ann Lee, 30, lives in Rome."}\r',
        b"y" * 300,  # no id to read: the line number
        b'{"id": "edge", "text": "' + b"z" * (200 - 26) + b'"}',  # exactly 200 bytes: fine
    ]
    assert len(lines[5]) == 200
    assert run_lines(llm, tmp_path, lines, "--max-line-bytes", 200) == 0
    out = check_exactly_once(lines, tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == [2, "crlf", 5, "edge"]
    assert out[0]["error"] == "input line 2: 5025 bytes, longer than --max-line-bytes 200"
    assert out[1]["ok"]
    assert out[2]["error"] == "input line 5: 300 bytes, longer than --max-line-bytes 200"
    assert out[3]["finish_reason"] is not None  # processed
    check_rerun_skips(llm, tmp_path, lines, "--max-line-bytes", 200)


def test_default_line_limit_is_one_mib(llm, tmp_path):
    lines = [b'{"id": "huge", "text": "' + b"w " * (1 << 19) + b'"}', OK_LINE]
    assert run_lines(llm, tmp_path, lines) == 0
    out = check_exactly_once(lines, tmp_path / "out.jsonl")
    assert out[0]["error"] == f"input line 1: {len(lines[0])} bytes, longer than --max-line-bytes 1048576"
    assert out[0]["id"] == 1 and out[1]["ok"]


def test_long_lines_are_never_read_whole():
    """The reader asks for at most --max-line-bytes + 1 bytes at a time."""
    import io

    class Reader(io.BytesIO):
        biggest = 0

        def readline(self, size=-1):
            assert size > 0
            Reader.biggest = max(Reader.biggest, size)
            return super().readline(size)

    data = b'{"text": "a"}\n' + b"q" * 10_000_000 + b"\n" + b'{"text": "b"}'
    rows = list(extract.read_rows(Reader(data), max_line_bytes=1000))
    assert [(r.line, r.text, r.error) for r in rows] == [
        (1, "a", None),
        (2, None, "input line 2: 10000000 bytes, longer than --max-line-bytes 1000"),
        (3, "b", None),
    ]
    assert Reader.biggest == 1 << 16


@pytest.mark.parametrize(
    "raw, error",
    [
        (b'{"id": 1' + b"0" * 5000 + b', "text": "x"}', "input line 1: not readable JSON: Exceeds the limit"),
        (b"[" * 100_000, "input line 1: not readable JSON: nested too deeply"),
        (b'{"id": "a", "text": null}', "input line 1: the 'text' field is null, not a string"),
        (b'{"id": "a", "text": {"t": 1}}', "input line 1: the 'text' field is {\"t\": 1}, not a string"),
        (b'{"id": "a", "text": NaN}', "input line 1: the 'text' field is NaN, not a string"),
        (b'"just a string"', "input line 1: expected a JSON object, got str"),
        (b"\xef\xbb\xbf\xff", "input line 1: not valid UTF-8 at byte offset 3 (invalid start byte)"),
    ],
    ids=["huge-int", "deep", "text-null", "text-object", "text-nan", "not-object", "bom-then-bad"],
)
def test_parse_line_poison(raw, error):
    """No model: lines json.loads raises other errors than JSONDecodeError on."""
    row = extract.parse_line(1, raw)
    assert row.text is None and row.error.startswith(error), row.error
    assert extract.parse_line(1, b'\xef\xbb\xbf{"text": "a"}') == extract.Row(1, 1, "a")  # a BOM


def test_cli_help_runs_without_the_model():
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "extract.py"), "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0 and "--stop-after" in r.stdout
