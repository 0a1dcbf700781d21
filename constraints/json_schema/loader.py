"""The one JSON Schema loader: what a schema may be given as, and the schema it stands for.

A schema is given as a dict or a bool (the schema itself), JSON text, a pydantic model class
(its ``model_json_schema()``) or another type pydantic can describe (a dataclass, a
TypedDict, ``list[int]``: ``pydantic.TypeAdapter(t).json_schema()``). :func:`load_schema`
returns the schema (a dict or a bool) or raises :class:`~..errors.ConstraintError` naming
what is wrong; :func:`is_schema_source` only checks the kind of value (no parsing);
:func:`schema_key` is the compiler's cache key (JSON text is its own key, unparsed).
Used by the compiler, the engine (``SamplingParams``, the output check) and
``examples/extract.py``.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ConstraintError, ConstraintTooComplex

KINDS = "a dict, a bool, JSON text, or a pydantic model class (or another type pydantic describes)"


def _is_type(schema: object) -> bool:
    """A class, or a parametrised type such as ``list[int]``."""
    return isinstance(schema, type) or hasattr(schema, "__origin__")


def is_schema_source(schema: object) -> bool:
    """Is ``schema`` a kind of value :func:`load_schema` takes (its content unchecked)?"""
    return isinstance(schema, (dict, bool, str)) or _is_type(schema)


def load_schema(schema: Any, limits=None) -> dict | bool:
    """The JSON Schema ``schema`` stands for (see the module docstring). JSON text longer
    than ``limits.max_schema_chars`` (default :class:`~..limits.Limits`) or nesting
    too deep to parse is refused with :class:`~..errors.ConstraintTooComplex`."""
    if isinstance(schema, (dict, bool)):
        return schema
    if isinstance(schema, str):
        return _parse(schema, limits)
    if _is_type(schema):
        name = getattr(schema, "__name__", None) or repr(schema)
        try:
            import pydantic
        except ImportError as e:  # pragma: no cover
            raise ImportError("JSON Schema from a model class needs pydantic: pip install pydantic") from e
        if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
            return schema.model_json_schema()
        try:
            return pydantic.TypeAdapter(schema).json_schema()
        except Exception as e:  # noqa: BLE001 - pydantic's errors name the problem
            raise ConstraintError(
                f"expected a JSON Schema, got the type {name}, which pydantic cannot describe: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                path="#",
            ) from None
    raise ConstraintError(f"expected a JSON Schema ({KINDS}), got {type(schema).__name__}", path="#")


def _parse(text: str, limits) -> dict | bool:
    from ..limits import Limits
    from .checks import nesting_pointer, too_long

    limits = limits or Limits()
    if len(text) > limits.max_schema_chars:
        raise too_long("schema text", len(text), limits.max_schema_chars, "max_schema_chars", path="#")
    try:
        out = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConstraintError(f"schema is not valid JSON: {e}", path="#") from e
    except RecursionError:
        where = nesting_pointer(text, limits.max_schema_nesting) or "#"
        raise ConstraintTooComplex(
            f"schema nests objects and arrays over {limits.max_schema_nesting} deep "
            "(Limits.max_schema_nesting)",
            bound="max_schema_nesting",
            path=where,
        ) from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise ConstraintError(f"schema is not valid JSON: {e}", path="#") from None
    if not isinstance(out, (dict, bool)):
        raise ConstraintError(f"a JSON Schema is an object or a bool, got {type(out).__name__}", path="#")
    return out


def schema_key(schema: Any) -> str:
    """A cache key for a schema as given (JSON text is its own key, not parsed)."""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, (dict, bool)):
        return json.dumps(schema, ensure_ascii=False)
    if _is_type(schema):
        name = f"{getattr(schema, '__module__', '')}.{getattr(schema, '__qualname__', repr(schema))}"
        return f"{name}:" + json.dumps(load_schema(schema))
    raise ConstraintError(f"json_schema must be {KINDS}, got {type(schema).__name__}", path="#")
