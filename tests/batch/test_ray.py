"""deepinfer.batch on a local Ray cluster (2 CPUs, 2 actors, a tiny random model): the same rows
as the single-process path, every input row exactly once, error rows naming their file and
line, resume after an early stop, a killed actor losing nothing; the embedded model end to end.
The commit's de-duplication and the argument checks without Ray."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter

import jsonschema
import pytest

from deepinfer.batch import main as batch_main
from deepinfer.batch.on_ray import Committer

from .conftest import SAMPLE, SCHEMA, argv

LINES = [
    b'{"id": "x1", "text": "Ann Lee, 30, lives in Rome."}',
    b"{not json",
    b'{"id": "x2", "text": 12}',
    b'{"id": "x1", "text": "a repeat"}',
    b"",
    b'{"id": 7, "text": "Bob Stone is 41 and lives in Paris."}',
    *(
        f'{{"id": "r{i}", "text": "Person {i} is {20 + i} and lives in Town {i}."}}'.encode()
        for i in range(14)
    ),
]


def main(args: list) -> int:
    return batch_main([str(a) for a in args])


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def check_rows(rows: list[dict]) -> None:
    for r in rows:
        assert set(r) >= {"id", "line", "ok", "data", "error", "finish_reason"}
        if r["ok"]:
            jsonschema.validate(r["data"], SCHEMA)
            assert r["error"] is None and r["finish_reason"] == "stop"
        else:
            assert r["data"] is None and r["error"]


def test_same_rows_as_one_process_and_rerun_writes_nothing(ray_cluster, tiny_model, tmp_path):
    """The Ray path's rows are the single-process path's (the same engine, greedy), each input
    row once; error rows identical; a re-run writes nothing."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(LINES) + b"\n")
    # deterministic: greedy rows equal across processes whatever their thread counts, load and
    # DSpark's drafting (without it, a near tie of the random-weight model once flipped a row)
    common = ["--model", tiny_model, "--max-tokens", 12, "--batch-size", 4, "--deterministic"]
    schema = SAMPLE / "schema.json"
    assert main(argv(schema, src, tmp_path / "one.jsonl", *common)) == 0
    ray_out = tmp_path / "ray.jsonl"
    assert main(argv(schema, src, ray_out, *common, "--ray", "auto", "--num-actors", 2)) == 0
    one, on_ray = read_jsonl(tmp_path / "one.jsonl"), read_jsonl(ray_out)
    assert sorted(r["line"] for r in on_ray) == [n for n, raw in enumerate(LINES, 1) if raw.strip()]
    assert sorted(on_ray, key=lambda r: r["line"]) == one
    check_rows(on_ray)
    errors = {r["line"]: r["error"] for r in on_ray if r["finish_reason"] is None}
    assert errors[2].startswith("input line 2: not valid JSON")
    assert errors[3] == "input line 3: the 'text' field is 12, not a string"
    assert errors[4].startswith('input line 4: id "x1" repeats the id of line 1;')
    before = ray_out.read_bytes()
    assert main(argv(schema, src, ray_out, *common, "--ray", "auto")) == 0
    assert ray_out.read_bytes() == before


def test_folder_of_jsonl_and_parquet_to_parquet_resumes(ray_cluster, tiny_model, tmp_path):
    """A folder (JSONL, Parquet, a subfolder) into a Parquet output: an early stop, then the
    resume writes exactly the rest, though rows were committed out of input order (the repeat
    of an id before its first row); an id repeated across files names the first file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.jsonl").write_bytes(b"\n".join(LINES[:8]) + b"\n")
    pq.write_table(
        pa.table(
            {
                "id": [f"p{i}" for i in range(6)] + ["x1"],
                "text": [f"Cy {i}, {i + 30}, Oslo" for i in range(6)] + ["dup"],
            }
        ),
        docs / "b.parquet",
    )
    late = b'{"id": "p2", "text": "a repeat of a row the first run leaves to the second"}'
    (docs / "sub" / "c.jsonl").write_bytes(b"\n".join([*LINES[8:], late]) + b"\n")
    (docs / "_ignored.jsonl").write_bytes(b"not read\n")
    out = tmp_path / "out.parquet"
    run = argv(SAMPLE / "schema.json", docs, out, "--model", tiny_model, "--max-tokens", 8, "--batch-size", 4)
    run += ["--ray", "auto", "--num-actors", 1]
    assert main([*run, "--stop-after", 1]) == 3
    first = pq.read_table(out).to_pylist()
    assert 0 < len(first) < 21
    assert main(run) == 0
    rows = pq.read_table(out).to_pylist()
    expect = [("a.jsonl", n) for n, raw in enumerate(LINES[:8], 1) if raw.strip()]
    expect += [("b.parquet", n) for n in range(1, 8)] + [("sub/c.jsonl", n) for n in range(1, len(LINES) - 6)]
    assert sorted((r["file"], r["line"]) for r in rows) == sorted(expect)
    assert rows[: len(first)] == first  # the first run's rows kept as they were
    by = {(r["file"], r["line"]): r for r in rows}
    assert by[("b.parquet", 7)]["error"] == (
        'input b.parquet line 7: id "x1" repeats the id of a.jsonl line 1; '
        "ids must be unique (--id-field names them)"
    )
    assert by[("a.jsonl", 2)]["error"].startswith("input a.jsonl line 2: not valid JSON")
    # (its repeat was written by the first run, before it: the resume still does b.parquet's p2)
    assert by[("sub/c.jsonl", len(LINES) - 7)]["error"].startswith(
        'input sub/c.jsonl line 13: id "p2" repeats'
    )
    assert by[("b.parquet", 3)]["finish_reason"] is not None
    for r in rows:
        assert (r["data"] is not None) == r["ok"]
        if r["ok"]:
            jsonschema.validate(json.loads(r["data"]), SCHEMA)
    assert Counter(r["id"] for r in rows)[json.dumps("x1")] == 3  # (ids are JSON text in Parquet)


def _actor_pids() -> list[int]:
    """The pids of this session's extraction actors (Ray's workers under this process)."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                if not fh.read().startswith(b"ray::MapWorker(MapBatches(ExtractActor))"):
                    continue
            pid, up = int(p), int(p)
            for _ in range(4):  # worker -> raylet -> ... -> this test process
                with open(f"/proc/{up}/stat") as fh:
                    up = int(fh.read().rsplit(")", 1)[1].split()[1])
                if up == os.getpid():
                    pids.append(pid)
                    break
        except (OSError, ValueError, IndexError):
            continue
    return pids


def test_killed_actor_loses_nothing(ray_cluster, tiny_model, tmp_path):
    """SIGKILL one actor once rows are being written: Ray restarts it and runs its batch again;
    the output holds every row exactly once."""
    src = tmp_path / "in.jsonl"
    n = 40
    src.write_text(
        "".join(json.dumps({"id": i, "text": f"Dee {i} is {i} and lives in Rome."}) + "\n" for i in range(n))
    )
    out = tmp_path / "out.jsonl"
    run = argv(SAMPLE / "schema.json", src, out, "--model", tiny_model, "--max-tokens", 24, "--batch-size", 2)
    status = []
    worker = threading.Thread(target=lambda: status.append(main([*run, "--ray", "auto", "--num-actors", 2])))
    worker.start()
    killed = None
    deadline = time.monotonic() + 60
    while worker.is_alive() and time.monotonic() < deadline:
        if out.exists() and out.read_bytes().count(b"\n") >= 2 and (pids := _actor_pids()):
            killed = pids[0]
            os.kill(killed, signal.SIGKILL)
            break
        time.sleep(0.05)
    worker.join(120)
    assert not worker.is_alive() and status == [0]
    assert killed is not None, "the run ended before an actor could be killed"
    rows = read_jsonl(out)
    assert len(rows) < n + 1 and sorted(r["line"] for r in rows) == list(range(1, n + 1))  # once each
    check_rows(rows)
    assert killed not in _actor_pids()


def test_unenforceable_schema_fails_the_run_with_exit_2(ray_cluster, tiny_model, tmp_path, capsys):
    """The actors' engine refuses the schema: the run stops with the compiler's message."""
    schema = tmp_path / "s.json"
    schema.write_text('{"properties": {"a": {"pattern": "(?<=x)y"}}}')
    src = tmp_path / "in.jsonl"
    src.write_bytes(LINES[0] + b"\n")
    assert main(argv(schema, src, tmp_path / "o.jsonl", "--model", tiny_model, "--ray", "auto")) == 2
    assert "the engine cannot enforce it" in capsys.readouterr().err


@pytest.mark.slow
def test_embedded_model_on_ray(ray_cluster, embedded_gguf_path, tmp_path):
    """The embedded model in one actor: the sample documents extracted and validated."""
    out = tmp_path / "out.jsonl"
    run = argv(SAMPLE / "schema.json", SAMPLE / "docs.jsonl", out, "--max-tokens", 64, "--batch-size", 3)
    assert main([*run, "--limit", 3, "--ray", "auto", "--num-actors", 1]) == 0
    rows = read_jsonl(out)
    assert sorted(r["id"] for r in rows) == ["a1", "a2", "a3"]
    check_rows(rows)
    assert all(r["ok"] for r in rows), rows


# -- without Ray ---------------------------------------------------------------------------------
class ListSink:
    min_rows = 1

    def __init__(self):
        self.written: list[bytes] = []

    def write(self, lines):
        self.written += lines


def test_committer_writes_each_row_once():
    """A batch that comes back a second time (a retried task) adds nothing."""
    sink = ListSink()
    c = Committer(sink)
    c.add(["a", "a"], [1, 2], [b"1\n", b"2\n"])
    c.add(["a", "b", "a"], [2, 2, 3], [b"2'\n", b"b2\n", b"3\n"])  # (a, 2) again
    c.add(["a", "a"], [1, 2], [b"1'\n", b"2''\n"])
    c.flush()
    assert sink.written == [b"1\n", b"2\n", b"b2\n", b"3\n"] and c.duplicates == 3


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--num-actors", "2"], "--num-actors needs --ray"),
        (["--gpus-per-actor", "1"], "--gpus-per-actor needs --ray"),
        (["--ray", "auto", "--num-actors", "0"], "--num-actors must be >= 1, got 0"),
        (["--ray", "auto", "--cpus-per-actor", "0"], "--cpus-per-actor must be > 0, got 0.0"),
        (["--ray", "auto", "--input", "{tmp}/nowhere"], "--input {tmp}/nowhere: no such file or folder"),
    ],
    ids=["actors-without-ray", "gpus-without-ray", "no-actors", "no-cpus", "no-input"],
)
def test_bad_ray_arguments_exit_2_before_anything_starts(tmp_path, capsys, extra, message):
    src = tmp_path / "in.jsonl"
    src.write_bytes(LINES[0] + b"\n")
    fill = {"tmp": str(tmp_path)}
    assert (
        main([*argv(SAMPLE / "schema.json", src, tmp_path / "o.jsonl"), *(a.format(**fill) for a in extra)])
        == 2
    )
    assert message.format(**fill) in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_one_process_parquet_output_resumes(tiny_model, tmp_path):
    """No Ray: a Parquet output from one process, stopped early and resumed; every row once,
    and a re-run adds no part."""
    import pyarrow.parquet as pq

    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(LINES) + b"\n")
    out = tmp_path / "out.parquet"
    run = argv(SAMPLE / "schema.json", src, out, "--model", tiny_model, "--max-tokens", 8, "--batch-size", 4)
    assert main([*run, "--stop-after", 1]) == 3
    assert sorted(p.name for p in out.iterdir()) == [".lock", "part-000000.parquet"]
    assert main(run) == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["line"] for r in rows] == [n for n, raw in enumerate(LINES, 1) if raw.strip()]
    assert rows[1]["error"].startswith("input line 2: not valid JSON") and rows[1]["file"] == ""
    assert main(run) == 0 and len(list(out.iterdir())) == 3
