"""The schema of a batch run: a JSON Schema file, or a pydantic model named ``module:Model`` /
``file.py:Model``; refused (UsageError, exit status 2) before any model loads when it is bad."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from typing import Any


class UsageError(Exception):
    """A problem with the arguments, the schema or the output file: reported, exit 2."""


@dataclass
class Schema:
    spec: Any  # what SamplingParams(json_schema=...) gets: a dict, or the pydantic model class
    as_dict: dict | bool  # for jsonschema and the prompt
    source: str


def load_schema(spec: str) -> Schema:
    """A JSON Schema file, or ``module:Model`` / ``file.py:Model`` naming a pydantic model."""
    if os.path.isfile(spec) or ":" not in spec or spec.lower().endswith(".json"):
        return _schema_file(spec)
    module_name, _, attr = spec.rpartition(":")
    if module_name.endswith(".py"):
        if not os.path.isfile(module_name):
            raise UsageError(f"--schema {spec}: no such file {module_name!r}")
        mod_spec = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module  # pydantic resolves annotations through it
        try:
            mod_spec.loader.exec_module(module)
        except Exception as e:
            raise UsageError(
                f"--schema {spec}: importing {module_name} failed: {type(e).__name__}: {e}"
            ) from e
    else:
        sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            raise UsageError(
                f"--schema {spec}: cannot import {module_name!r}: {type(e).__name__}: {e}"
            ) from e
    model = getattr(module, attr, None)
    if model is None:
        raise UsageError(f"--schema {spec}: module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(model, type) and hasattr(model, "model_json_schema")):
        raise UsageError(f"--schema {spec}: {attr!r} is not a pydantic model class")
    from deepinfer.constraints import ConstraintError, load_schema  # (the one schema loader)

    try:
        return _checked(Schema(model, load_schema(model), spec))
    except ConstraintError as e:
        raise UsageError(f"--schema {spec}: {e}") from e


def _schema_file(path: str) -> Schema:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as e:
        raise UsageError(f"schema file {path}: cannot read it: {e.strerror or e}") from e
    from deepinfer.constraints import ConstraintError, load_schema  # (the one schema loader)

    try:
        schema = load_schema(text)
    except ConstraintError as e:
        bad = e.__cause__
        if isinstance(bad, json.JSONDecodeError):
            raise UsageError(
                f"schema file {path}: not valid JSON: {bad.msg} at line {bad.lineno}, column {bad.colno}"
            ) from e
        raise UsageError(f"schema file {path}: {e}") from e
    return _checked(Schema(schema, schema, path))


def _checked(schema: Schema) -> Schema:
    """Refuse a schema that is not a valid JSON Schema (meta-schema check)."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema.as_dict).check_schema(schema.as_dict)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        raise UsageError(
            f"schema file {schema.source}: not a valid JSON Schema at /{where}: {e.message}"
        ) from e
    return schema
