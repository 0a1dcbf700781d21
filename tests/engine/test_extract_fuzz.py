"""examples/extract.py on random input, property-based: random bytes, JSON lines with any kind
of id and text (lone surrogates, floats, repeats), blank and over-long lines. Every non-blank
input line comes out exactly once, as valid JSON; rows that can be processed are, the others
carry an error naming their line; a re-run, or a resume after an early stop, writes nothing
twice. The reading layer is checked directly, the whole script through main() with a stub
LLM (fast), and a few examples with the embedded model (slow)."""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
import zlib
from types import SimpleNamespace

import pytest

from deepinfer._text import lone_surrogate

from .test_extract import SAMPLE, extract

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MAX = 300  # --max-line-bytes here: over-long lines are cheap to make
BLANK = frozenset(b" \t\r\x0b\x0c")  # what bytes.strip() takes away

# -- random input, with what each line must become ------------------------------------------------
SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])
CLEAN = st.text(max_size=10)  # (hypothesis' text: no surrogates)
TEXT = st.text(st.one_of(st.characters(), SURROGATES), max_size=10)
IDS = st.one_of(
    st.sampled_from(["a", "b", 1, 2, 3]),  # repeats, and ids equal to line numbers
    CLEAN,
    st.integers(),
    TEXT,
    st.floats(),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


def _clean(s) -> bool:
    return isinstance(s, str) and lone_surrogate(s) is None


POOL = st.sampled_from(["a", "b", 1, 2, 3])  # repeats, and ids equal to line numbers
GOOD_IDS = st.one_of(POOL, POOL, CLEAN, st.integers(-5, 50))


@st.composite
def json_line(draw, valid=False):
    """(bytes, expected): expected is ("row", id or None for the line number, text) or "error".
    ``valid``: mostly a row that can be processed (a string id may still repeat one)."""
    obj = {}
    if draw(st.booleans()):
        obj["id"] = draw(GOOD_IDS if valid else IDS)
    if valid or draw(st.integers(0, 9)):
        obj["text"] = draw(CLEAN if valid else st.one_of(TEXT, CLEAN, st.integers(), st.none()))
    if draw(st.booleans()):
        obj["other"] = draw(st.one_of(CLEAN, st.integers()) if valid else TEXT)
    ascii = draw(st.booleans())
    # ensure_ascii=False with a lone surrogate: its UTF-8-like bytes make the line not UTF-8
    raw = json.dumps(obj, ensure_ascii=ascii).encode("utf-8", "surrogatepass")
    row_id = obj.get("id")
    ok_id = "id" not in obj or _clean(row_id) or (isinstance(row_id, int) and not isinstance(row_id, bool))
    utf8 = ascii or all(_clean(v) for v in obj.values() if isinstance(v, str))
    if ok_id and _clean(obj.get("text")) and utf8:
        return raw, ("row", row_id, obj["text"])
    return raw, "error"


@st.composite
def not_utf8_line(draw):
    """A JSON line (ASCII) with a byte that is never UTF-8 put in: an error at that offset."""
    raw, _ = draw(json_line().filter(lambda x: x[0].isascii()))
    at = draw(st.integers(0, len(raw)))
    return raw[:at] + bytes([draw(st.sampled_from([0x80, 0xBF, 0xC0, 0xFF]))]) + raw[at:], ("utf8", at)


@st.composite
def surrogate_line(draw):
    """A lone surrogate in the id or the text, written as JSON escapes: an error row."""
    bad = draw(st.tuples(CLEAN, SURROGATES, CLEAN).map("".join))
    obj = {"id": bad, "text": draw(CLEAN)} if draw(st.booleans()) else {"id": draw(GOOD_IDS), "text": bad}
    return json.dumps(obj).encode(), "error"


@st.composite
def cut_line(draw):
    """A valid line cut short: not JSON."""
    raw, _ = draw(json_line(valid=True))
    return raw[: draw(st.integers(1, len(raw) - 1))], "error"


LINES = st.one_of(
    surrogate_line(),
    cut_line(),
    json_line(valid=True),
    json_line(valid=True),
    json_line(valid=True),
    json_line(),
    json_line(),
    not_utf8_line(),
    st.binary(max_size=30).map(lambda b: (b.replace(b"\n", b""), None)),  # None: anything goes
    st.sampled_from([b"", b" ", b"\t", b"\r", b" \t\r"]).map(lambda b: (b, "blank")),
    st.integers(MAX - 12, MAX + 100).map(lambda n: (b'{"text": "' + b"x" * n + b'"}', None)),  # near MAX
)


@st.composite
def inputs(draw, max_lines=12):
    """(file bytes, {line number: expected}) where expected is as above or "long"."""
    lines = draw(st.lists(LINES, max_size=max_lines))
    if lines and draw(st.booleans()):  # a byte order mark on the first line
        lines[0] = (b"\xef\xbb\xbf" + lines[0][0], lines[0][1])
    expect = {}
    for n, (raw, e) in enumerate(lines, 1):
        body = raw[3:] if n == 1 and raw.startswith(b"\xef\xbb\xbf") else raw
        if set(body) <= BLANK:
            e = "blank" if len(raw) <= MAX else "long"
        elif len(raw) > MAX:
            e = "long"
        elif isinstance(e, tuple) and e[0] == "utf8" and n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            e = ("utf8", e[1] + 3)
        expect[n] = e
    data = b"\n".join(raw for raw, _ in lines) + (b"\n" if draw(st.booleans()) else b"")
    return data, expect


def check_row_against(n: int, e, row_id, text, error, processed: bool = False) -> None:
    """A row (from read_rows, or an output row) is what its input line must become.
    ``processed``: an output row the model was run for (its error, if any, is the model's)."""
    if error is None or processed:
        assert text is None or (isinstance(text, str) and _clean(text))
        assert _clean(row_id) or (type(row_id) is int)
        assert isinstance(e, tuple) and e[0] == "row" or e is None  # only valid rows are processed
    else:
        assert isinstance(error, str) and error.startswith(f"input line {n}: ")
    if e == "long":
        assert re.fullmatch(rf"input line {n}: \d+ bytes, longer than --max-line-bytes {MAX}", error)
        assert row_id == n
    elif isinstance(e, tuple) and e[0] == "utf8":
        assert error.startswith(f"input line {n}: not valid UTF-8 at byte offset {e[1]} (") and row_id == n
    elif isinstance(e, tuple) and e[0] == "row":
        assert extract.key_of(row_id) == extract.key_of(n if e[1] is None else e[1])
        if text is not None:  # (read_rows: the text; an output row: no text to compare)
            assert text == e[2] and error is None
    elif e == "error":
        assert error is not None


# -- the reading layer: lines -> rows -> output lines -> resume ------------------------------------
@given(inp=inputs(), data=st.data())
def test_read_rows_on_random_input(inp, data):
    raw, expect = inp
    rows = list(extract.read_rows(io.BytesIO(raw), max_line_bytes=MAX))
    assert [r.line for r in rows] == [n for n, e in expect.items() if e != "blank"]
    for r in rows:
        check_row_against(r.line, expect[r.line], r.id, r.text, r.error)
        assert (r.text is None) == (r.error is not None)
    planned = list(extract.plan_rows(rows))
    assert not any(done for _, done in planned)
    first = {}
    for r, _ in planned:  # the first processed row with an id keeps it; later ones are errors
        if r.error is None:
            assert extract.key_of(r.id) not in first
            first[extract.key_of(r.id)] = r.line
        elif "repeats the id of line" in r.error:
            assert r.error.endswith(
                f"of line {first[extract.key_of(r.id)]}; ids must be unique (--id-field names them)"
            )
    out = [
        extract.dumps_row(
            extract.error_record(r, r.error) if r.error else {"id": r.id, "line": r.line, "ok": True}
        )
        for r, _ in planned
    ]
    for line, (r, _) in zip(out, planned):  # valid UTF-8 JSON that reads back to the same id
        rec = json.loads(line.decode("utf-8"))
        assert extract.key_of(rec["id"]) == extract.key_of(r.id) and rec["line"] == r.line
    k = data.draw(st.integers(0, len(out)), label="rows already written")
    with tempfile.TemporaryDirectory() as d:  # an interrupted run wrote k rows: the rest is to do
        path = os.path.join(d, "out.jsonl")
        with open(path, "wb") as fh:
            fh.write(b"".join(out[:k]))
        done = extract.done_ids(path)
        assert [is_done for _, is_done in extract.plan_rows(rows, done)] == [True] * k + [False] * (
            len(rows) - k
        )


# -- the whole script ------------------------------------------------------------------------------
class StubLLM:
    """An LLM without a model: by a hash of the prompt, a valid object or a failure of each kind
    (schema-invalid, not JSON, cut by max_tokens, an engine error, a refused request)."""

    ANSWERS = [
        ('{"name": "Ann", "age": 30, "city": "Rome"}', "stop", None),
        ('{"name": "", "age": -1, "city": "Rome"}', "stop", None),
        ("NaN", "stop", None),
        ('{"name": "An', "length", "max_tokens reached before the constraint was complete"),
        ("", "error", "the engine said no"),
        None,  # chat raises ValueError for it
    ]

    def compile_constraint(self, params):
        return None

    def _answer(self, conv):
        return self.ANSWERS[zlib.crc32(conv[-1]["content"].encode()) % len(self.ANSWERS)]

    def chat(self, convs, params, use_tqdm=True):
        convs = [convs] if isinstance(convs[0], dict) else convs
        answers = [self._answer(c) for c in convs]
        if None in answers:
            raise ValueError("the prompt is too long")
        return [SimpleNamespace(text=t, finish_reason=f, error=e) for t, f, e in answers]


def _strict(name):
    raise ValueError(f"{name} in an output line")


def run_and_check(llm, raw: bytes, expect: dict, extra: list[str], stop: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
        with open(src, "wb") as fh:
            fh.write(raw)
        argv = ["--schema", str(SAMPLE / "schema.json"), "--input", src, "--output", dst]
        argv += ["--max-line-bytes", str(MAX), "--no-progress", *extra]
        if stop:  # an early stop, then the resume
            assert extract.main([*argv, "--stop-after", "1"], llm=llm) in (0, 3)
        assert extract.main(argv, llm=llm) == 0
        with open(dst, "rb") as fh:
            written = fh.read()
        out = [json.loads(line, parse_constant=_strict) for line in written.decode("utf-8").splitlines()]
        assert [r["line"] for r in out] == [n for n, e in expect.items() if e != "blank"]  # once each
        for r in out:
            assert set(r) >= {"id", "line", "ok", "data", "error", "finish_reason"}
            if r["ok"]:
                assert r["error"] is None and r["finish_reason"] == "stop" and isinstance(r["data"], dict)
            else:
                assert r["data"] is None and isinstance(r["error"], str) and r["error"]
            processed = r["finish_reason"] is not None
            check_row_against(r["line"], expect[r["line"]], r["id"], None, r["error"], processed)
        assert extract.main(argv, llm=llm) == 0  # a re-run has nothing left to do
        with open(dst, "rb") as fh:
            assert fh.read() == written


@given(inp=inputs(), batch=st.integers(1, 4), stop=st.booleans())
def test_main_on_random_input(inp, batch, stop):
    run_and_check(StubLLM(), *inp, ["--batch-size", str(batch)], stop)


@pytest.fixture(scope="module")
def llm(embedded_gguf_path):
    from deepinfer import LLM

    return LLM(seed=0)


@pytest.mark.slow
@settings(max_examples=8)
@given(inp=inputs(max_lines=5), stop=st.booleans())
def test_main_on_random_input_with_the_model(llm, inp, stop):
    run_and_check(llm, *inp, ["--batch-size", "2", "--max-tokens", "12"], stop)
