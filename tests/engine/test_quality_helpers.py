"""benchmarks/bench_quality.py's scoring helpers (pure functions, no model): the first JSON object
in free text, field accuracy on nested answers, and the data set's own consistency."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_quality", ROOT / "benchmarks" / "bench_quality.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bq = _load_bench()


# -- first_json_object -------------------------------------------------------------------------
def test_first_json_object_plain():
    assert bq.first_json_object('{"a": 1}') == {"a": 1}


def test_first_json_object_text_before_and_after():
    text = (
        'Sure! Here is the JSON:\n```json\n{"name": "Ann", "age": 52}\n```\nLet me know {if} you need more.'
    )
    assert bq.first_json_object(text) == {"name": "Ann", "age": 52}


def test_first_json_object_braces_and_quotes_inside_strings():
    text = 'x {"note": "a } brace { and \\"quoted }\\" text", "n": {"k": [1, {"m": "}"}]}} y'
    assert bq.first_json_object(text) == {
        "note": 'a } brace { and "quoted }" text',
        "n": {"k": [1, {"m": "}"}]},
    }


def test_first_json_object_skips_what_json_refuses():
    # a balanced {...} that is not JSON comes first; the next object is found
    assert bq.first_json_object("{not json} then {'single': 1} then {\"ok\": true}") == {"ok": True}


def test_first_json_object_unclosed_outer_finds_inner():
    # cut output: the outer object never closes; the first complete one is the inner object
    assert bq.first_json_object('{"a": {"b": 2}, "c": [') == {"b": 2}


@pytest.mark.parametrize(
    "text", ["", "no object here", "[1, 2, 3]", '{"a": 1', "}{", "{x} and {y: 1} are not JSON"]
)
def test_first_json_object_none(text):
    assert bq.first_json_object(text) is None


def test_first_json_span_offsets():
    text = 'ab {"x": "}"} cd'
    start, end, obj = bq.first_json_span(text)
    assert text[start:end] == '{"x": "}"}' and obj == {"x": "}"}


# -- field_accuracy ----------------------------------------------------------------------------
PERSON = {"name": "Maria Lopez", "age": 52, "city": "Madrid"}
INVOICE = {
    "number": "INV-1",
    "total": 93.48,
    "items": [
        {"description": "Desk lamp", "quantity": 3, "unit_price": 24.5},
        {"description": "Extension cord", "quantity": 2, "unit_price": 9.99},
    ],
}
ADDRESS = {"recipient": "Anna", "address": {"street": "Lindenstrasse 14", "postal_code": "10115"}}


def test_field_accuracy_exact():
    assert bq.field_accuracy(PERSON, dict(PERSON)) == (3, 3)


def test_field_accuracy_case_and_surrounding_space():
    assert bq.field_accuracy(PERSON, {"name": "  maria LOPEZ\n", "age": 52, "city": "MADRID "}) == (3, 3)
    # only surrounding space is ignored, not space inside the value
    assert bq.field_accuracy(PERSON, {"name": "Maria  Lopez", "age": 52, "city": "Madrid"}) == (2, 3)


def test_field_accuracy_numbers_as_numbers():
    assert bq.field_accuracy(PERSON, {"name": "Maria Lopez", "age": 52.0, "city": "Madrid"}) == (3, 3)
    assert bq.field_accuracy({"price": 12.5}, {"price": 12.50}) == (1, 1)
    assert bq.field_accuracy({"total": 93.48}, {"total": 93.480}) == (1, 1)
    assert bq.field_accuracy({"age": 52}, {"age": 22}) == (0, 1)
    assert bq.field_accuracy({"age": 52}, {"age": "52"}) == (1, 1)  # the value counts; validity the type
    assert bq.field_accuracy({"age": 52}, {"age": "fifty-two"}) == (0, 1)
    assert bq.field_accuracy({"age": 1}, {"age": True}) == (0, 1)  # a bool is not the number 1


def test_field_accuracy_booleans():
    assert bq.field_accuracy({"in_stock": False}, {"in_stock": False}) == (1, 1)
    assert bq.field_accuracy({"in_stock": False}, {"in_stock": 0}) == (0, 1)
    assert bq.field_accuracy({"in_stock": True}, {"in_stock": "True"}) == (1, 1)


def test_field_accuracy_nested_object():
    out = {"recipient": "anna", "address": {"street": "Lindenstrasse 14", "postal_code": 10115}}
    assert bq.field_accuracy(ADDRESS, out) == (3, 3)
    # the nested fields flattened to the top level are not at their path
    flat = {"recipient": "Anna", "street": "Lindenstrasse 14", "postal_code": "10115"}
    assert bq.field_accuracy(ADDRESS, flat) == (1, 3)


def test_field_accuracy_arrays_by_position():
    out = {
        "number": "inv-1",
        "total": 93.48,
        "items": [
            {"description": "desk lamp", "quantity": 3.0, "unit_price": 24.50},
            {"description": "Extension cord", "quantity": 20, "unit_price": 9.99},
        ],
    }
    assert bq.field_accuracy(INVOICE, out) == (7, 8)
    swapped = dict(out, items=out["items"][::-1])
    assert bq.field_accuracy(INVOICE, swapped) == (2, 8)
    short = dict(out, items=out["items"][:1])  # a missing item: its fields are wrong
    assert bq.field_accuracy(INVOICE, short) == (5, 8)
    assert bq.field_accuracy(INVOICE, dict(out, items="none")) == (2, 8)


def test_field_accuracy_missing_or_unparseable():
    assert bq.field_accuracy(PERSON, None) == (0, 3)
    assert bq.field_accuracy(PERSON, {}) == (0, 3)
    assert bq.field_accuracy(PERSON, {"name": "Maria Lopez"}) == (1, 3)
    assert bq.field_accuracy(PERSON, {"name": None, "age": None, "city": None}) == (0, 3)


def test_field_names_fold_indices():
    assert [bq.field_name(p) for p, _ in bq.leaves(INVOICE)][2:5] == [
        "items[].description",
        "items[].quantity",
        "items[].unit_price",
    ]


# -- the data set --------------------------------------------------------------------------------
def test_data_set_is_consistent(capsys):
    docs, schemas = bq.load_data()
    assert len(docs) >= 60 and set(schemas) == {d["domain"] for d in docs}
    assert bq.check_data() == 0, capsys.readouterr().out
    for d in docs:  # every answer scores full marks against itself
        n = len(bq.leaves(d["answer"]))
        assert bq.field_accuracy(d["answer"], d["answer"]) == (n, n)


def test_prompt_is_mode_independent():
    docs, schemas = bq.load_data()
    conv = bq.prompt_for(docs[0], schemas[docs[0]["domain"]])
    assert [m["role"] for m in conv] == ["user"]
    assert conv[0]["content"].startswith("Extract the following fields from the text as JSON: name (string)")
    assert conv[0]["content"].endswith("Text: " + docs[0]["text"])
