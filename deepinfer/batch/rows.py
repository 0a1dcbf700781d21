"""Input rows: JSONL lines (or Parquet records) -> Rows, and the plan of which rows a run does.

A row that cannot be processed carries an error naming its input line (and its file, where
the input is a folder) and becomes an error row; nothing here raises on content. Where a row
has no usable id, its line number is its id.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from deepinfer._text import lone_surrogate

DEFAULT_MAX_LINE_BYTES = 1 << 20
_BOM = b"\xef\xbb\xbf"


@dataclass
class Row:
    line: int  # 1-based line number in the input (a Parquet file: the record's number)
    id: Any
    text: str | None  # None: a row that is not processed, see error
    error: str | None = None
    file: str = ""  # the input file within an input folder ("" for a single input file)


def where(line: int, file: str = "") -> str:
    """How an error names a row: 'input line 3', or 'input part-1.jsonl line 3' in a folder."""
    return f"input {file} line {line}" if file else f"input line {line}"


def brief(value: Any, limit: int = 40) -> str:
    """A value as (at most ``limit`` characters of) JSON, for an error message."""
    try:
        s = json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        s = type(value).__name__
    return s if len(s) <= limit else s[: limit - 3] + "..."


def key_of(row_id: Any) -> str:
    """An id as a dict key: 1 and "1" are different ids; a lone surrogate is escaped."""
    return json.dumps(row_id)


def iter_lines(fh: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number, line without its newline, its length in bytes) for each line of a binary
    file; the line is None where it is longer than ``max_line_bytes`` (its bytes are skipped
    in chunks, never held whole)."""
    line_no = 0
    while True:
        chunk = fh.readline(max_line_bytes + 1)
        if not chunk:
            return
        line_no += 1
        if chunk.endswith(b"\n"):
            yield line_no, chunk[:-1], len(chunk) - 1
        elif len(chunk) <= max_line_bytes:  # the last line, with no newline
            yield line_no, chunk, len(chunk)
        else:
            size = len(chunk)
            while chunk and not chunk.endswith(b"\n"):
                chunk = fh.readline(1 << 16)
                size += len(chunk)
            yield line_no, None, size - chunk.endswith(b"\n")


def parse_line(
    line_no: int, raw: bytes, text_field: str = "text", id_field: str = "id", file: str = ""
) -> Row:
    """One input line (bytes, no newline) as a Row; a line that cannot be processed gets an
    error naming it (and the line number as id where it has no usable id of its own)."""

    def bad(why: str) -> Row:
        return Row(line_no, line_no, None, f"{where(line_no, file)}: {why}", file)

    skip = len(_BOM) if line_no == 1 and raw.startswith(_BOM) else 0  # a UTF-8 byte order mark
    try:
        line = raw[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        return bad(f"not valid UTF-8 at byte offset {skip + e.start} ({e.reason})")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return bad(f"not valid JSON: {e.msg} (column {e.colno})")
    except RecursionError:
        return bad("not readable JSON: nested too deeply")
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        return bad(f"not readable JSON: {str(e)[:80]}")
    if not isinstance(obj, dict):
        return bad(f"expected a JSON object, got {type(obj).__name__}")
    return parse_object(line_no, obj, text_field, id_field, file)


def parse_object(line_no: int, obj: dict, text_field: str, id_field: str, file: str = "") -> Row:
    """One input record (a JSON object, or a Parquet record as a dict) as a Row."""

    def bad(why: str, row_id: Any = line_no) -> Row:
        return Row(line_no, row_id, None, f"{where(line_no, file)}: {why}", file)

    row_id = obj.get(id_field, line_no)
    if not isinstance(row_id, str | int) or isinstance(row_id, bool):
        return bad(f"the {id_field!r} field is {brief(row_id)}, not a string or an integer")
    if isinstance(row_id, str) and (i := lone_surrogate(row_id)) is not None:
        return bad(
            f"the {id_field!r} field holds a lone surrogate ({row_id[i]!r} at character {i}): "
            "not Unicode text",
            row_id,
        )
    text = obj.get(text_field)
    if not isinstance(text, str):
        if text_field not in obj:
            return bad(f"no {text_field!r} field", row_id)
        return bad(f"the {text_field!r} field is {brief(text)}, not a string", row_id)
    if (i := lone_surrogate(text)) is not None:
        return bad(
            f"the {text_field!r} field holds a lone surrogate ({text[i]!r} at character {i}): "
            "not Unicode text",
            row_id,
        )
    return Row(line_no, row_id, text, None, file)


def read_rows(
    source: str | os.PathLike | BinaryIO,
    text_field: str = "text",
    id_field: str = "id",
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    file: str = "",
) -> Iterator[Row]:
    """Every non-blank line of a JSONL file (a path, or a file opened in binary) as a Row;
    one that cannot be processed carries an error naming its line. Never raises on content."""
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as fh:
            yield from read_rows(fh, text_field, id_field, max_line_bytes, file)
        return
    for line_no, raw, size in iter_lines(source, max_line_bytes):
        if raw is None:
            yield Row(
                line_no,
                line_no,
                None,
                f"{where(line_no, file)}: {size} bytes, longer than --max-line-bytes {max_line_bytes}",
                file,
            )
        elif (raw[len(_BOM) :] if line_no == 1 and raw.startswith(_BOM) else raw).strip():  # not blank
            yield parse_line(line_no, raw, text_field, id_field, file)


def plan_rows(rows: Iterable[Row], done: Counter[str] | None = None) -> Iterator[tuple[Row, bool]]:
    """Each row with whether the output already holds it (``done``: output rows per id key,
    from ``done_ids``): the k-th row with an id is done when k output rows have it. A row whose
    id an earlier processed row already has becomes an error row naming that row's line (it
    keeps the id, so a re-run counts it); error rows claim no id."""
    done = done if done is not None else Counter()
    seen: Counter[str] = Counter()
    first: dict[str, tuple[str, int]] = {}  # id key -> (file, line) of the row processed under it
    for row in rows:
        key = key_of(row.id)
        seen[key] += 1
        if row.error is None:
            if key in first:
                file, line = first[key]
                of = f"line {line}" if file == row.file else f"{file or 'input'} line {line}"
                row = Row(
                    row.line,
                    row.id,
                    None,
                    f"{where(row.line, row.file)}: id {brief(row.id, 60)} repeats the id of {of}; "
                    "ids must be unique (--id-field names them)",
                    row.file,
                )
            else:
                first[key] = (row.file, row.line)
        yield row, seen[key] <= done[key]
