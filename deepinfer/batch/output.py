"""Where a batch run writes: JSONL (one file, appended to) or Parquet (a folder of parts).

Both are locked (flock) for the whole run, so a second run on the same output exits at once;
both are written a batch at a time and made durable (fsync) before the run goes on, so an
interrupted run loses no finished row; both tell a re-run which ids they hold already.

Output rows: {"id", "line", ("file",) "ok", "data", "error", "finish_reason", ("text")}. In
Parquet, "id" and "data" are JSON text (ids may be strings or integers; data has the schema's
shape), the other columns plain values.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections import Counter
from typing import Any, BinaryIO

from .rows import Row, key_of
from .schema import UsageError

try:
    import fcntl
except ImportError:  # (not on Windows: runs there take no lock)
    fcntl = None


def dumps_row(rec: dict) -> bytes:
    """One output line: UTF-8 JSON, or ASCII-escaped JSON where a string holds a lone
    surrogate (escaped, it reads back as the same string)."""
    try:
        return (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(rec) + "\n").encode("ascii")


def error_record(row: Row, error: str, finish_reason: str | None = None) -> dict:
    rec: dict[str, Any] = {"id": row.id, "line": row.line}
    if row.file:
        rec["file"] = row.file
    rec.update(ok=False, data=None, error=error, finish_reason=finish_reason)
    return rec


def open_output(path: str) -> tuple[BinaryIO, bool]:
    """The output file opened for appending and locked (flock, non-blocking), and whether this
    call created it. Refuses (UsageError) a missing folder, a file that cannot be opened, and a
    file another run holds."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--output {path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"--output {path}: is a folder")
    if os.path.exists(path) and not os.path.isfile(path):  # e.g. /dev/stdout: nothing to resume from
        raise UsageError(f"--output {path}: not a regular file")
    while True:
        created = True
        try:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                created = False
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError as e:
            raise UsageError(f"--output {path}: cannot open it for writing: {e.strerror or e}") from e
        fh = os.fdopen(fd, "ab")
        if fcntl is None:  # (no flock here: no lock)
            return fh, created
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            fh.close()
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise UsageError(
                    f"--output {path}: another run holds the lock on it (one run per output file)"
                ) from e
            raise UsageError(f"--output {path}: cannot lock it: {e.strerror or e}") from e
        try:  # still the file at that path (a run that gave up may have removed it meanwhile)?
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fh, created
        except FileNotFoundError:
            pass
        fh.close()


def done_ids(path: str) -> Counter[str]:
    """How many output rows each id (as ``key_of``) has in the output file. A truncated last
    line (a crash mid-write) is cut off the file; any other unreadable line is an error."""
    return Counter(key for key, _, _ in done_rows(path))


def done_rows(path: str) -> list[tuple[str, str, int]]:
    """(id key, file, line) of each row in the output file (file "" where a row has none),
    repaired as ``done_ids`` tells."""
    ids: list[tuple[str, str, int]] = []
    if not os.path.exists(path):
        return ids
    with open(path, "rb") as fh:
        data = fh.read()
    good_end = 0  # byte offset after the last complete row
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        last = i == len(lines) - 1
        if not raw.strip():
            if not last:
                good_end += len(raw) + 1
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict) or "id" not in rec:
                raise ValueError("not an output row")
        except (ValueError, RecursionError) as e:
            if last or all(not x.strip() for x in lines[i + 1 :]):
                print(
                    f"repairing {path}: dropping a truncated last line ({len(raw)} bytes); its row is redone",
                    file=sys.stderr,
                )
                break
            raise UsageError(
                f"output file {path}: line {i + 1} is not an output row ({str(e)[:80]}); fix or move it"
            ) from e
        ids.append((key_of(rec["id"]), rec.get("file", ""), rec.get("line")))
        good_end += len(raw) + (0 if last else 1)
        if last:  # a complete row without its newline: keep it, end the line
            with open(path, "ab") as fh:
                fh.write(b"\n")
            good_end += 1
    if good_end < len(data):
        os.truncate(path, good_end)
    return ids


# -- sinks: the output of a run, JSONL or Parquet ---------------------------------------------
def open_sink(path: str) -> JsonlSink | ParquetSink:
    """The output named by --output: a folder of Parquet parts where it ends in .parquet, else
    a JSONL file. Checked and locked here, before any model loads."""
    return ParquetSink(path) if path.rstrip("/").lower().endswith(".parquet") else JsonlSink(path)


class JsonlSink:
    """One JSONL file, appended to; a row per line."""

    min_rows = 1  # written (and fsync'ed) a batch at a time

    def __init__(self, path: str):
        self.path = path
        self.fh, self.created = open_output(path)

    def done(self) -> Counter[str]:
        return done_ids(self.path)

    def done_rows(self) -> set[tuple[str, str, int]]:
        """(id key, file, line) of each row written: where rows are not in input order."""
        return set(done_rows(self.path))

    def write(self, lines: list[bytes]) -> None:
        """Append output lines (from ``dumps_row``) and make them durable."""
        self.fh.write(b"".join(lines))
        self.fh.flush()
        os.fsync(self.fh.fileno())  # a finished batch survives a crash from here on

    def close(self, failed: bool = False) -> None:
        try:  # leave no empty file behind where this run created it and wrote nothing
            if failed and self.created and os.fstat(self.fh.fileno()).st_size == 0:
                os.unlink(self.path)
        except OSError:
            pass
        self.fh.close()  # (and the lock with it)


PARQUET_COLUMNS = ("id", "line", "file", "ok", "data", "error", "finish_reason", "text")


def _parquet_schema():
    import pyarrow as pa

    s, i, b = pa.string(), pa.int64(), pa.bool_()
    return pa.schema(list(zip(PARQUET_COLUMNS, (s, i, s, b, s, s, s, s))))


class ParquetSink:
    """A folder of Parquet parts, ``part-000000.parquet`` on: one part per write, each written
    whole to a temporary name and renamed (a part is there whole or not at all). The folder's
    ``.lock`` file holds the lock."""

    min_rows = 10_000  # rows a part holds at least (but the last; and a Ray run's after 30 s)

    def __init__(self, path: str):
        self.path = path
        parent = os.path.dirname(os.path.abspath(path.rstrip("/")))
        if not os.path.isdir(parent):
            raise UsageError(f"--output {path}: folder {parent} does not exist")
        if os.path.exists(path) and not os.path.isdir(path):
            raise UsageError(f"--output {path}: a .parquet output is a folder of parts; this is a file")
        self.created = not os.path.exists(path)
        os.makedirs(path, exist_ok=True)
        self.lock, _ = open_output(os.path.join(path, ".lock"))
        self.parts = sorted(p for p in os.listdir(path) if p.startswith("part-") and p.endswith(".parquet"))

    def done(self) -> Counter[str]:
        return Counter(key for key, _, _ in self.done_rows(as_list=True))

    def done_rows(self, as_list: bool = False) -> Any:
        """(id key, file, line) of each row written (a set; ``as_list``: every one)."""
        import pyarrow.parquet as pq

        ids: list[tuple[str, str, int]] = []
        for name in os.listdir(self.path):
            if name.startswith(".part-") and name.endswith(".tmp"):  # a crash mid-write: redone
                print(f"repairing {self.path}: removing an unfinished part {name}", file=sys.stderr)
                os.unlink(os.path.join(self.path, name))
        for name in self.parts:
            try:
                part = pq.read_table(os.path.join(self.path, name), columns=["id", "file", "line"])
            except Exception as e:
                raise UsageError(
                    f"output {self.path}: part {name} is not readable ({str(e)[:80]}); fix or move it"
                ) from e
            d = part.to_pydict()  # (the id column is the id's JSON: its key)
            ids += zip(d["id"], d["file"], d["line"])
        return ids if as_list else set(ids)

    def write(self, lines: list[bytes]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        recs = [json.loads(line) for line in lines]
        cols: dict[str, list] = {c: [] for c in PARQUET_COLUMNS}
        for r in recs:
            cols["id"].append(key_of(r["id"]))
            cols["data"].append(None if r.get("data") is None else json.dumps(r["data"], ensure_ascii=False))
            for c in ("line", "file", "ok", "error", "finish_reason", "text"):
                cols[c].append(r.get(c, "" if c == "file" else None))
        table = pa.table(cols, schema=_parquet_schema())
        name = f"part-{len(self.parts):06d}.parquet"
        tmp = os.path.join(self.path, f".{name}.tmp")
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, os.path.join(self.path, name))
        dir_fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename, durable
        finally:
            os.close(dir_fd)
        self.parts.append(name)

    def close(self, failed: bool = False) -> None:
        if failed and self.created and not self.parts:
            try:
                os.unlink(os.path.join(self.path, ".lock"))
                os.rmdir(self.path)
            except OSError:
                pass
        self.lock.close()
