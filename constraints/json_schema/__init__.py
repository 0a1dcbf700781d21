"""The JSON Schema front end: a schema lowered to the grammar IR (:mod:`..ir`).

- :mod:`.loader`: the one schema loader (dict, bool, JSON text, pydantic model or type);
- :mod:`.lowering`: :func:`schema_to_grammar`, the schema compiler, made of the keyword
  groups :mod:`.merge` (allOf, oneOf), :mod:`.objects`, :mod:`.arrays`, :mod:`.logic`
  (not, anyOf, if/then/else) and :mod:`.scalars` (strings, numbers), over the languages of
  :mod:`.formats` (JSON strings, ``format``) and :mod:`.numbers` (JSON numbers, ranges),
  with the shared helpers of :mod:`.common`.
"""

from .loader import load_schema, schema_key

__all__ = ["load_schema", "schema_key", "schema_to_grammar"]


def __getattr__(name: str):
    if name == "schema_to_grammar":  # the lowering loads on first use (the loader alone is light)
        from .lowering import schema_to_grammar

        return schema_to_grammar
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
