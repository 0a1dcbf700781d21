"""The run on a Ray cluster: Ray Data reads the input, an actor pool of engines extracts, the
driver commits.

1. Read: ``read_binary_files`` over the input (a JSONL or Parquet file, or a folder of them),
   each file parsed into rows by the reading task (``parse_files``: the same checks, the same
   error rows as the single-process path).
2. Plan, on the driver: the rows' ids (not their texts) in input order (``plan_rows``),
   against the rows the output already holds: a row is done where the output has its id at
   its file and line (rows are committed as they come, so counting ids as the single-process
   path does would not tell which of two rows with one id is done). Rows already written are
   skipped; error rows (bad lines, repeated ids) are committed at once; the others are the
   run's work, sent back to the reading tasks as a set of (file, line) per file.
3. Extract: ``map_batches`` to a pool of ``ExtractActor`` (one LLM each, loaded once, the
   constraint compiled once), ``--num-actors`` of them with ``--cpus-per-actor`` /
   ``--gpus-per-actor`` each. An actor that dies is restarted and Ray runs its batch again.
4. Commit, on the driver: output rows are appended (durably) as batches come back, each
   (file, line) at most once: a row that comes back twice is dropped here.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from .extractor import EngineConfig, Extractor
from .output import JsonlSink, ParquetSink, dumps_row, error_record
from .rows import Row, key_of, parse_object, plan_rows, read_rows, where
from .schema import UsageError

INPUT_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet")
READ_CPUS = 0  # what a reading task asks of the cluster: light (I/O, parsing), beside actors holding CPUs


def _arrow_schema():
    import pyarrow as pa

    return pa.schema(
        [("file", pa.string()), ("line", pa.int64()), ("key", pa.string()), ("text", pa.string()),
         ("error", pa.string()), ("size", pa.int64())]
    )  # fmt: skip


def connect(address: str) -> bool:
    """Connect to the Ray cluster at ``address`` ('auto': a running one, else one started here
    for this run). Already connected (a caller's ray.init): that one. True where this call
    started Ray (the run shuts it down)."""
    try:
        import ray
    except ImportError as e:
        raise UsageError("--ray needs Ray: pip install 'deepinfer[ray]'") from e
    if ray.is_initialized():
        return False
    try:
        if address == "auto":
            try:
                ray.init(address="auto")
            except ConnectionError:
                ray.init(include_dashboard=False)
            return True
        ray.init(address=address)
        return True
    except Exception as e:
        raise UsageError(f"--ray {address}: cannot connect: {type(e).__name__}: {str(e)[:200]}") from e


def input_files(path: str) -> list[tuple[str, str]]:
    """(absolute path, name in the output) of each input file: the file itself (name ""), or
    the .jsonl / .parquet files in a folder and its subfolders, sorted by name (hidden and
    ``_`` names left out). Sorted order is input order: the first of repeated ids wins."""
    if os.path.isfile(path):
        return [(os.path.abspath(path), "")]
    if not os.path.isdir(path):
        raise UsageError(f"--input {path}: no such file or folder")
    found = []
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        for n in names:
            if not n.startswith((".", "_")) and n.lower().endswith(INPUT_SUFFIXES):
                full = os.path.join(root, n)
                found.append((os.path.abspath(full), os.path.relpath(full, path)))
    if not found:
        raise UsageError(f"--input {path}: no {', '.join(INPUT_SUFFIXES)} files in the folder")
    return sorted(found, key=lambda f: f[1])


def file_rows(data: bytes, name: str, fmt: str, text_field: str, id_field: str, max_line_bytes: int):
    """The Rows of one input file's bytes: JSONL lines, or Parquet records (numbered from 1)."""
    if fmt == "jsonl":
        yield from read_rows(io.BytesIO(data), text_field, id_field, max_line_bytes, name)
        return
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(io.BytesIO(data))
    except Exception as e:  # one error row for a file that is not Parquet
        yield Row(1, 1, None, f"{where(1, name)}: not a readable Parquet file: {str(e)[:120]}", name)
        return
    columns = [c for c in (id_field, text_field) if c in pf.schema_arrow.names]
    line = 0
    for batch in pf.iter_batches(columns=columns):
        for obj in batch.to_pylist():
            line += 1
            yield parse_object(line, obj, text_field, id_field, name)


def parse_files(
    batch: Any,
    names: dict,
    text_field: str,
    id_field: str,
    max_line_bytes: int,
    columns: list[str],
    todo: Any = None,
):
    """A Ray Data batch of input files (columns bytes, path) -> tables of rows (``columns`` of
    file, line, key, text, error, size: the text's bytes). ``todo`` (an object ref of {file:
    sorted line numbers}): only those rows, for the extraction."""
    import numpy as np
    import pyarrow as pa

    wanted = _todo(todo) if todo is not None else None
    cols: dict[str, list] = {c: [] for c in ("file", "line", "key", "text", "error", "size")}

    def table():
        out = pa.table(cols, schema=_arrow_schema()).select(columns)
        for c in cols.values():
            c.clear()
        return out

    for data, path in zip(batch.column("bytes").to_pylist(), batch.column("path").to_pylist()):
        name = names.get(path, names.get(os.path.abspath(path), path))
        fmt = "parquet" if path.lower().endswith(".parquet") else "jsonl"
        keep = None if wanted is None else wanted.get(name, np.empty(0, np.int64))
        for row in file_rows(data, name, fmt, text_field, id_field, max_line_bytes):
            if keep is not None and (row.error is not None or not _holds(keep, row.line)):
                continue
            cols["file"].append(row.file)
            cols["line"].append(row.line)
            cols["key"].append(json.dumps(row.id))
            cols["text"].append(row.text)
            cols["error"].append(row.error)
            cols["size"].append(0 if row.text is None else len(row.text.encode("utf-8")))
            if len(cols["line"]) >= 4096:
                yield table()
    if cols["line"]:
        yield table()


def _holds(sorted_lines: Any, line: int) -> bool:
    import numpy as np

    i = int(np.searchsorted(sorted_lines, line))
    return i < len(sorted_lines) and int(sorted_lines[i]) == line


_TODO_CACHE: dict[str, Any] = {}


def _todo(ref: Any) -> dict:
    """The run's work ({file: sorted line numbers}), fetched once per worker process."""
    import ray

    key = ref.hex()
    if key not in _TODO_CACHE:
        _TODO_CACHE.clear()
        _TODO_CACHE[key] = ray.get(ref)
    return _TODO_CACHE[key]


class ExtractActor:
    """One engine on the cluster: an LLM loaded once, the constraint compiled once. A batch of
    rows (file, line, key, text) -> their output rows (file, line, row: one JSON line)."""

    def __init__(self, config: EngineConfig):
        self.error: Exception | None = None
        try:
            self.extractor = Extractor(config)
        except UsageError as e:  # told by __call__ (an error here would restart the actor, on and on)
            self.error = e

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        schema = pa.schema([("file", pa.string()), ("line", pa.int64()), ("row", pa.binary())])
        if self.error is not None:  # line 0: the run stops with this message (exit status 2)
            return pa.table({"file": [""], "line": [0], "row": [str(self.error).encode()]}, schema=schema)
        d = batch.to_pydict()
        rows = [
            Row(line, json.loads(key), text, None, file)
            for file, line, key, text in zip(d["file"], d["line"], d["key"], d["text"])
        ]
        recs = self.extractor.records(rows)
        rows_out = [dumps_row(r) for r in recs]
        return pa.table({"file": d["file"], "line": d["line"], "row": rows_out}, schema=schema)


class Committer:
    """Appends output rows to the sink, each (file, line) once: a row that comes back a second
    time (a batch run again after a failure) is dropped. Writes when ``sink.min_rows`` rows are
    waiting, or ``max_wait_s`` after the first of them, and at the end."""

    def __init__(self, sink: JsonlSink | ParquetSink, max_wait_s: float = 30.0):
        self.sink = sink
        self.max_wait_s = max_wait_s
        self.committed: set[tuple[str, int]] = set()
        self.waiting: list[bytes] = []
        self.since = 0.0
        self.duplicates = 0

    def add(self, files: list[str], lines: list[int], raws: list[bytes]) -> None:
        for f, n, raw in zip(files, lines, raws):
            if (f, n) in self.committed:
                self.duplicates += 1
                continue
            self.committed.add((f, n))
            if not self.waiting:
                self.since = time.monotonic()
            self.waiting.append(raw)
        if len(self.waiting) >= self.sink.min_rows or (
            self.waiting and time.monotonic() - self.since >= self.max_wait_s
        ):
            self.flush()

    def flush(self) -> None:
        if self.waiting:
            self.sink.write(self.waiting)
            self.waiting = []


def run_on_ray(args: argparse.Namespace, config: EngineConfig, sink: JsonlSink | ParquetSink) -> int:
    config.params()  # (a bad --max-tokens etc. refused before anything starts)
    started = connect(args.ray)
    try:
        return _run(args, config, sink)
    finally:
        if started:
            import ray

            ray.shutdown()


def _run(args: argparse.Namespace, config: EngineConfig, sink: JsonlSink | ParquetSink) -> int:
    import numpy as np
    import pyarrow as pa
    import ray
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = not args.no_progress
    files = input_files(args.input)
    names = dict(files)
    read_args = dict(text_field=args.text_field, id_field=args.id_field, max_line_bytes=args.max_line_bytes)

    def read(columns: list[str], todo: Any = None) -> Any:
        ds = ray.data.read_binary_files([f for f, _ in files], include_paths=True, num_cpus=READ_CPUS)
        return ds.map_batches(
            parse_files,
            batch_format="pyarrow",
            batch_size=None,
            fn_kwargs={"names": names, "columns": columns, "todo": todo, **read_args},
            num_cpus=READ_CPUS,
        )

    # 2. plan: every row's id and error, in input order, against the output
    columns = ["file", "line", "key", "error", "size"]
    meta = list(read(columns).iter_batches(batch_format="pyarrow", batch_size=None))
    order = {name: i for i, (_, name) in enumerate(files)}
    table = pa.concat_tables(meta) if meta else _arrow_schema().empty_table().select(columns)
    rank = pa.array([order[f] for f in table.column("file").to_pylist()], pa.int64())
    table = table.append_column("rank", rank).sort_by([("rank", "ascending"), ("line", "ascending")])
    done = sink.done_rows()  # (rows are committed as they come, not in input order)

    def planned() -> Iterator[Row]:
        d = table.to_pydict()
        for file, line, key, error, size in zip(d["file"], d["line"], d["key"], d["error"], d["size"]):
            sizes.append(size)
            yield Row(line, json.loads(key), None if error else "", error, file)

    todo: dict[str, list[int]] = defaultdict(list)
    errors: list[bytes] = []
    sizes: list[int] = []  # (of the row just planned)
    new = todo_bytes = 0
    for row, _ in plan_rows(planned()):
        if (key_of(row.id), row.file, row.line) in done:
            continue
        if args.limit is not None and new >= args.limit:
            break
        new += 1
        if row.error is not None:
            errors.append(dumps_row(error_record(row, row.error)))
        else:
            todo[row.file].append(row.line)
            todo_bytes += sizes[-1]
    if errors:
        sink.write(errors)
    n_todo = sum(map(len, todo.values()))
    print(
        f"{len(table)} rows in {len(files)} file(s): {len(table) - new} done already, "
        f"{len(errors)} error rows written, {n_todo} to extract",
        file=sys.stderr,
    )
    if not n_todo:
        return 0

    # 3. extract on the actor pool, 4. commit
    todo_ref = ray.put({f: np.asarray(lines, np.int64) for f, lines in todo.items()})
    gpus, model = args.gpus_per_actor, config.model
    actor_config = dataclasses.replace(
        config,
        schema=dataclasses.replace(config.schema, spec=config.schema.as_dict),  # (plain JSON travels)
        model=os.path.abspath(model) if model and os.path.exists(model) else model,  # (workers' cwd differs)
        device="cuda" if gpus > 0 else "cpu",
        threads=None if gpus > 0 else max(1, int(args.cpus_per_actor)),
    )
    # Blocks of about a batch: they spread over the actors (one block goes to one actor). A
    # repartition would do it too, but as tasks of a whole CPU: stuck while the actors hold all.
    context = DataContext.get_current()
    saved_block_bytes = context.target_max_block_size
    context.target_max_block_size = max(1024, (todo_bytes // n_todo + 96) * args.batch_size)
    try:
        return _extract(args, read(["file", "line", "key", "text"], todo_ref), actor_config, sink)
    finally:
        context.target_max_block_size = saved_block_bytes


def _extract(args: argparse.Namespace, work: Any, actor_config: EngineConfig, sink: Any) -> int:
    from ray.data import ActorPoolStrategy

    gpus = args.gpus_per_actor
    results = work.map_batches(
        ExtractActor,
        fn_constructor_kwargs={"config": actor_config},
        compute=ActorPoolStrategy(size=args.num_actors),
        batch_size=args.batch_size,
        batch_format="pyarrow",
        num_cpus=args.cpus_per_actor,
        num_gpus=gpus,
        # (Ray Data's default for an actor pool: an actor that dies is restarted, without end,
        # and the batches it held run again: max_restarts=-1, max_task_retries=-1)
    )
    committer = Committer(sink)
    batches = 0
    try:
        for batch in results.iter_batches(batch_format="pyarrow", batch_size=None):
            d = batch.to_pydict()
            if 0 in d["line"]:  # an actor's engine refused the schema
                raise UsageError(d["row"][d["line"].index(0)].decode())
            committer.add(d["file"], d["line"], d["row"])
            batches += 1
            if args.stop_after is not None and batches >= args.stop_after:
                committer.flush()
                print(f"stopped after {batches} batch(es) (--stop-after); re-run to resume", file=sys.stderr)
                return 3
    finally:
        committer.flush()
    return 0
