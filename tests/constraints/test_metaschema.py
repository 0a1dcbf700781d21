"""The fast metaschema check (:mod:`deepinfer.constraints.json_schema.metaschema`) against
its reference, jsonschema's own check, on random schemas of every draft it compiles: valid
ones and ones with a keyword's value of the wrong type or out of range. Its draft lookup and
JSON equality against jsonschema's, and a new process compiling a schema without importing
jsonschema."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from deepinfer.constraints import Compiler, ConstraintError
from deepinfer.constraints.json_schema import checks
from deepinfer.constraints.json_schema.metaschema import (
    DRAFT_URIS,
    _equal,
    _unique,
    checker,
    draft_name,
    metaschema_valid,
)

from .vocabs import small_vocab

DRAFTS = {
    "draft 4": "http://json-schema.org/draft-04/schema#",
    "draft 6": "http://json-schema.org/draft-06/schema#",
    "draft 7": "http://json-schema.org/draft-07/schema#",
    "draft 2019-09": "https://json-schema.org/draft/2019-09/schema",
    "draft 2020-12": "https://json-schema.org/draft/2020-12/schema",
}
SCALARS = [None, True, False, 0, 1, -1, 2.5, 1.0, -0.5, 3, "", "a", "^x$", "#a", "a#b", "string", "integer"]
TYPES = ["array", "boolean", "integer", "null", "number", "object", "string", "thing"]
COUNTS = ["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
          "minContains", "maxContains"]  # fmt: skip
NUMBERS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"]
SINGLE = ["items", "additionalItems", "additionalProperties", "not", "contains", "propertyNames",
          "if", "then", "else", "unevaluatedItems", "unevaluatedProperties", "contentSchema"]  # fmt: skip
MAPS = ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"]
LISTS = ["allOf", "anyOf", "oneOf", "prefixItems"]
OTHER = ["type", "enum", "const", "required", "dependencies", "dependentRequired", "uniqueItems",
         "pattern", "format", "$ref", "$id", "id", "$anchor", "title", "default", "x-custom"]  # fmt: skip


def random_value(rng: random.Random, depth: int):
    r = rng.random()
    if depth <= 0 or r < 0.5:
        return rng.choice(SCALARS)
    if r < 0.75:
        return [random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "b", "type"]): random_value(rng, depth - 1) for _ in range(rng.randint(0, 2))}


def random_schema(rng: random.Random, depth: int, bad: float):
    """A schema of random keywords; each value is of the type its metaschema wants except
    with probability ``bad`` (then any JSON value)."""
    if depth <= 0 or rng.random() < 0.15:
        return rng.choice([True, False, {}, {"type": rng.choice(TYPES[:-1])}])
    out: dict = {}
    for _ in range(rng.randint(1, 4)):
        kw = rng.choice(COUNTS + NUMBERS + SINGLE + MAPS + LISTS + OTHER)
        if rng.random() < bad:
            out[kw] = random_value(rng, 2)
            continue
        sub = lambda: random_schema(rng, depth - 1, bad)  # noqa: E731
        if kw in COUNTS:
            v = rng.choice([0, 1, 5, 2.0])
        elif kw in NUMBERS:
            v = rng.choice([0, 1, 2.5, -3] + [True] * kw.startswith("exclusive"))
        elif kw in SINGLE:
            v = sub()
        elif kw in MAPS:
            v = {rng.choice(["a", "b", "^c"]): sub() for _ in range(rng.randint(0, 3))}
        elif kw in LISTS:
            v = [sub() for _ in range(rng.randint(0, 3))]
        elif kw == "type":
            v = rng.choice([rng.choice(TYPES), rng.sample(TYPES[:-1], rng.randint(0, 3)), ["string"] * 2])
        elif kw == "enum":
            v = [random_value(rng, 1) for _ in range(rng.randint(0, 3))]
        elif kw == "const":
            v = random_value(rng, 2)
        elif kw in ("required",):
            v = rng.choice([["a"], ["a", "b"], ["a", "a"], []])
        elif kw in ("dependencies", "dependentRequired"):
            v = {"a": rng.choice([["b"], sub(), ["b", "b"]])}
        elif kw == "uniqueItems":
            v = rng.choice([True, False])
        elif kw in ("$ref",):
            v = rng.choice(["#", "#/$defs/a", "#/definitions/a"])
        elif kw in ("$id", "id"):
            v = rng.choice(["http://example.com/s", "#a", "a#b", "s.json"])
        elif kw == "$anchor":
            v = rng.choice(["a", "1a", "a-b"])
        else:
            v = random_value(rng, 2)
        out[kw] = v
    return out


def reference_valid(schema, cls) -> bool:
    return next(iter(checks.jsonschema_validator(cls).iter_errors(schema)), None) is None


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_fast_metaschema_check_agrees_with_jsonschema(draft):
    cls = jsonschema.validators.validator_for({"$schema": DRAFTS[draft]})
    assert checker(cls.__name__) is not None, f"no compiled metaschema for {draft}"
    rng = random.Random(hash(draft) & 0xFFFF)
    seen = {True: 0, False: 0}
    for i in range(600):
        schema = random_schema(rng, 3, bad=0.0 if i % 3 == 0 else 0.08)
        if isinstance(schema, dict):
            schema = {"$schema": DRAFTS[draft], **schema}
        want = reference_valid(schema, cls)
        got = metaschema_valid(schema, cls.__name__, 1000)
        assert got == want, (draft, schema)
        seen[want] += 1
    assert min(seen.values()) > 50, seen  # (both verdicts well represented)


def test_a_schema_of_an_unknown_draft_is_left_to_jsonschema():
    assert checker("Draft3Validator") is None
    assert metaschema_valid({"type": "string"}, "Draft3Validator", 1) is None


def test_draft_lookup_is_jsonschemas():
    """DRAFT_URIS is jsonschema's own table, and draft_name picks jsonschema's class (2020-12
    by default) for every form of $schema: with and without "#", unknown, absent, not a string."""
    table = {uri: cls.__name__ for uri, cls in jsonschema.validators._META_SCHEMAS.store.items()}
    assert table == DRAFT_URIS
    forms = [*DRAFTS.values(), *(u.rstrip("#") + "#" for u in DRAFTS.values()), *DRAFT_URIS,
             "http://example.com/custom", "", "HTTP://JSON-SCHEMA.ORG/draft-07/schema#", 7, None]  # fmt: skip
    for form in forms:
        schema = {"$schema": form, "type": "string"}
        if isinstance(form, str):
            default = jsonschema.Draft202012Validator
            want = jsonschema.validators.validator_for(schema, default=default).__name__
        else:  # (not a URI: the 2020-12 default, whose metaschema then refuses it)
            want = "Draft202012Validator"
        assert draft_name(schema) == want, form
        assert checks.metaschema_class(schema).__name__ == want, form
    assert draft_name(True) == draft_name({}) == "Draft202012Validator"


def test_json_equality_is_jsonschemas():
    """_equal and _unique (enum, const, uniqueItems) decide as jsonschema's own on random values:
    1 == 1.0, True != 1, by value through arrays and objects."""
    from jsonschema._utils import equal, uniq

    rng = random.Random(11)
    values = [random_value(rng, 3) for _ in range(300)] + [1, 1.0, True, False, 0, 0.0, [1], [1.0], [True],
                                                            {"a": 1}, {"a": 1.0}, {"a": True}]  # fmt: skip
    for i, a in enumerate(values):
        for b in values[i : i + 40]:
            assert _equal(a, b) == equal(a, b), (a, b)
    for i in range(0, len(values) - 4, 3):
        items = values[i : i + 4]
        assert _unique(items) == uniq(items), items


def test_compiling_a_schema_imports_no_jsonschema():
    """The metaschema check of a valid schema needs neither jsonschema nor referencing: a new
    process compiles a schema without importing them (about 100 ms of its first compilation)."""
    code = (
        "import sys\n"
        "from deepinfer.constraints import Compiler\n"
        "from tests.constraints.vocabs import small_vocab\n"
        "c = Compiler(small_vocab())\n"
        "c.json_schema({'$schema': 'http://json-schema.org/draft-07/schema#', 'type': 'object',"
        " 'properties': {'a': {'enum': [1, 2.5, None]}, 'b': {'type': 'array', 'uniqueItems': True}}})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jsonschema', 'referencing')))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_an_invalid_schema_is_refused_with_jsonschemas_error_and_pointer():
    c = Compiler(small_vocab())
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"minItems": -1}}}}
    with pytest.raises(ConstraintError) as info:
        c.json_schema(schema)
    e = info.value
    assert e.path == "#/properties/a/items/minItems" and "metaschema" in str(e), str(e)
