"""Checks a JSON Schema passes before it is lowered: bounded in size, made of JSON values
only, and valid under its draft's metaschema (jsonschema's own check).

Each refusal is a :class:`~..errors.ConstraintError` naming the JSON pointer of the value
at fault; a size bound is a :class:`~..errors.ConstraintTooComplex` naming the bound (a
field of :class:`~..limits.Limits`). All of it runs in time linear in the schema,
without recursion except inside jsonschema (whose depth the nesting bound keeps low), and
stops at the compile deadline.

- :func:`nesting_pointer`: where a JSON text nests past a depth (found without parsing it,
  for texts too deep for :func:`json.loads`);
- :func:`check_value`: the schema as Python values (``Limits.max_schema_nodes``,
  ``max_schema_nesting``, ``max_schema_chars``, ``max_properties``; JSON types only, finite
  numbers, no lone surrogates);
- :func:`check_metaschema`: valid under the metaschema of the schema's draft (2020-12 when it
  names none), decided by the compiled check of :mod:`.metaschema`; a schema it finds
  invalid goes through jsonschema's own check (the reference), which names the error, in
  pieces of at most :data:`CHUNK_NODES` values for big schemas so that the deadline is
  checked between them.
"""

from __future__ import annotations

import json
import math
import re

from ..errors import ConstraintError, ConstraintTooComplex, is_recursion_error
from ..limits import headroom, out_of_time, past_deadline

# keywords whose values are data, not schemas (no "properties" to count below them)
DATA_KEYWORDS = frozenset(("enum", "const", "default", "examples"))
# keywords whose value maps names to schemas
MAP_KEYWORDS = frozenset(("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"))
# counts (lengths, numbers of items and properties): an automaton's counter is a machine int
COUNT_KEYWORDS = frozenset(
    (
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "minContains",
        "maxContains",
    )
)
MAX_COUNT = 10**12
MAX_INT_DIGITS = 4_300  # (the digits json.loads and str() take: sys.get_int_max_str_digits())
MAX_INT_BITS = int(MAX_INT_DIGITS * 3.3219)  # an integer of fewer bits has at most that many digits
CHUNK_NODES = 512  # a schema larger than this is checked against its metaschema in pieces


def pointer(parts) -> str:
    """The JSON pointer ``#/a/0/b`` of a path of keys and indices."""
    out = "#"
    for k in parts:
        out += "/" + str(k).replace("~", "~0").replace("/", "~1")
    return out


def too_long(what: str, n: int, bound: int, field: str, **where) -> ConstraintTooComplex:
    return ConstraintTooComplex(
        f"{what} has {n:,} characters, over the bound of {bound:,} (Limits.{field})", bound=field, **where
    )


# ----------------------------------------------------------------------- JSON text


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},:]', re.S)


def nesting_pointer(text: str, max_nesting: int) -> str | None:
    """The JSON pointer of the first array or object of JSON ``text`` nested more than
    ``max_nesting`` deep, or None (a linear scan of its tokens; the text need not be valid)."""
    frames: list[list] = []  # per open container: [is_object, key or index, expecting a key]
    for m in _TOKEN.finditer(text):
        tok = m.group()
        c = tok[0]
        if c in "[{":
            if len(frames) >= max_nesting:
                return pointer(f[1] for f in frames)
            frames.append([c == "{", None if c == "{" else 0, c == "{"])
        elif c in "]}":
            if frames:
                frames.pop()
        elif c == ",":
            if frames:
                f = frames[-1]
                if f[0]:
                    f[2] = True
                else:
                    f[1] += 1
        elif c == ":":
            if frames:
                frames[-1][2] = False
        elif frames and frames[-1][0] and frames[-1][2]:  # a key
            try:
                frames[-1][1] = json.loads(tok)
            except ValueError:
                frames[-1][1] = tok[1:-1]
    return None


# ------------------------------------------------------------------- schema values


def _short(n: int | float) -> str:
    """A number for a message (a huge one abbreviated)."""
    text = repr(n)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"


def _surrogate(s: str) -> int:
    """Index of the first lone surrogate in ``s``, or -1."""
    if s.isascii():
        return -1
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return -1


_SCHEMA, _MAP, _DATA = 0, 1, 2


def check_value(schema: object, limits, deadline: float | None = None) -> dict[int, int]:
    """Check that ``schema`` is JSON within the size bounds of ``limits``; return the number
    of values under each object and array (by ``id``), which :func:`check_metaschema` uses
    to cut a big schema in pieces."""
    max_nodes, max_nesting = limits.max_schema_nodes, limits.max_schema_nesting
    max_props, max_chars = limits.max_properties, limits.max_schema_chars
    parents: list[int] = []  # per value visited: its parent's index (-1: the root)
    keys: list[object] = []  # per value: its key or index in the parent
    containers: list[tuple[int, int]] = []  # (index, id) of each object and array
    stack: list[tuple[object, int, object, int, int]] = [(schema, -1, None, 0, _SCHEMA)]
    chars = 0

    def where(i: int, *more) -> str:
        """The pointer of value ``i`` (and of ``more`` keys below it)."""
        parts = []
        while i > 0:
            parts.append(keys[i])
            i = parents[i]
        return pointer([*reversed(parts), *more])

    while stack:
        v, parent, key, depth, ctx = stack.pop()
        me = len(parents)
        parents.append(parent)
        keys.append(key)
        if me >= max_nodes:
            raise ConstraintTooComplex(
                f"schema has over {max_nodes:,} JSON values (Limits.max_schema_nodes)",
                bound="max_schema_nodes",
                path=where(me),
            )
        if not me & 4095 and past_deadline(deadline):
            raise out_of_time("schema check", limits, path=where(me))
        t = type(v)
        if t is str or isinstance(v, str):
            chars += len(v)
            bad = _surrogate(v)
            if bad >= 0:
                raise ConstraintError(
                    f"string holds a lone surrogate (U+{ord(v[bad]):04X} at character {bad}), which "
                    "is not valid UTF-8",
                    path=where(me),
                )
        elif t is dict or isinstance(v, dict):
            if depth >= max_nesting:
                raise _too_deep(max_nesting, where(me))
            containers.append((me, id(v)))
            if ctx == _SCHEMA:
                for kw in COUNT_KEYWORDS.intersection(v):
                    n = v[kw]
                    if (
                        isinstance(n, (int, float))
                        and not isinstance(n, bool)
                        and math.isfinite(n)
                        and n > MAX_COUNT
                    ):
                        raise ConstraintTooComplex(
                            f"{kw} {_short(n)} exceeds the bound on counts ({MAX_COUNT:,})",
                            bound="MAX_COUNT",
                            path=where(me, kw),
                        )
                props = v.get("properties")
                if isinstance(props, dict) and len(props) > max_props:
                    raise ConstraintTooComplex(
                        f"'properties' has {len(props):,} entries, over the bound of {max_props:,} "
                        "(Limits.max_properties)",
                        bound="max_properties",
                        path=where(me, "properties"),
                    )
            for k, x in v.items():
                if not isinstance(k, str):
                    raise ConstraintError(
                        f"object key {k!r} is not a string (a schema is JSON)", path=where(me)
                    )
                chars += len(k) + 1
                bad = _surrogate(k)
                if bad >= 0:
                    raise ConstraintError(
                        f"object key holds a lone surrogate (U+{ord(k[bad]):04X} at character {bad}), "
                        "which is not valid UTF-8",
                        path=where(me, k),
                    )
                if ctx == _SCHEMA:
                    sub = _DATA if k in DATA_KEYWORDS else _MAP if k in MAP_KEYWORDS else _SCHEMA
                else:
                    sub = _DATA if ctx == _DATA else _SCHEMA
                stack.append((x, me, k, depth + 1, sub))
        elif t is list or isinstance(v, list):
            if depth >= max_nesting:
                raise _too_deep(max_nesting, where(me))
            containers.append((me, id(v)))
            sub = _DATA if ctx == _DATA else _SCHEMA
            for i in range(len(v) - 1, -1, -1):
                stack.append((v[i], me, i, depth + 1, sub))
        elif v is None or t is bool or isinstance(v, bool):
            pass
        elif t is int or isinstance(v, int):
            if v.bit_length() > MAX_INT_BITS:
                raise ConstraintError(
                    f"an integer of over {MAX_INT_DIGITS:,} digits (Python's JSON limit)", path=where(me)
                )
        elif t is float or isinstance(v, float):
            if not math.isfinite(v):
                raise ConstraintError(f"{v!r} is not a JSON number", path=where(me))
        else:
            raise ConstraintError(
                f"a value of type {t.__name__} is not JSON (a schema is JSON)", path=where(me)
            )
        if chars + me > max_chars:
            raise ConstraintTooComplex(
                f"schema has over {max_chars:,} characters (Limits.max_schema_chars)",
                bound="max_schema_chars",
                path=where(me),
            )
    # values under each container: children come after their parent in visiting order
    sizes = [1] * len(parents)
    for i in range(len(parents) - 1, 0, -1):
        sizes[parents[i]] += sizes[i]
    return {ident: sizes[i] for i, ident in containers}


# ---------------------------------------------------------------------- metaschema

# where each draft's metaschema checks a value against the whole metaschema again: the
# values of these keywords that are objects are schemas, checked as schemas of their own
# when a big schema is cut in pieces (single: the value; maps: each value; lists: each item)
_SINGLE_4 = ("additionalItems", "additionalProperties", "items", "not")
_SINGLE_6 = (*_SINGLE_4, "contains", "propertyNames")
_SINGLE_7 = (*_SINGLE_6, "if", "then", "else")
_SINGLE_2019 = (*_SINGLE_7, "unevaluatedItems", "unevaluatedProperties", "contentSchema")
_SINGLE_2020 = tuple(k for k in _SINGLE_2019 if k != "additionalItems")
_LISTS = ("allOf", "anyOf", "oneOf")
APPLICATORS = {  # validator class name -> (single, maps, lists)
    "Draft3Validator": (
        ("additionalItems", "additionalProperties", "items", "extends"),
        ("properties", "patternProperties", "dependencies"),
        ("items", "extends"),
    ),
    "Draft4Validator": (
        _SINGLE_4,
        ("properties", "patternProperties", "definitions", "dependencies"),
        (*_LISTS, "items"),
    ),
    "Draft6Validator": (
        _SINGLE_6,
        ("properties", "patternProperties", "definitions", "dependencies"),
        (*_LISTS, "items"),
    ),
    "Draft7Validator": (
        _SINGLE_7,
        ("properties", "patternProperties", "definitions", "dependencies"),
        (*_LISTS, "items"),
    ),
    "Draft201909Validator": (
        _SINGLE_2019,
        ("properties", "patternProperties", "$defs", "definitions", "dependencies", "dependentSchemas"),
        (*_LISTS, "items"),
    ),
    "Draft202012Validator": (
        _SINGLE_2020,
        ("properties", "patternProperties", "$defs", "definitions", "dependencies", "dependentSchemas"),
        (*_LISTS, "prefixItems"),
    ),
}


DRAFTS = {
    "Draft3Validator": "draft 3",
    "Draft4Validator": "draft 4",
    "Draft6Validator": "draft 6",
    "Draft7Validator": "draft 7",
    "Draft201909Validator": "draft 2019-09",
    "Draft202012Validator": "draft 2020-12",
}


def metaschema_class(schema: object):
    """The jsonschema validator class of ``schema``'s draft (2020-12 when it names none)."""
    import jsonschema

    from .metaschema import draft_name

    return getattr(jsonschema, draft_name(schema))


def check_metaschema(
    schema: object, limits=None, deadline: float | None = None, sizes: dict[int, int] | None = None
) -> None:
    """Refuse ``schema`` unless it is valid under its draft's metaschema: jsonschema's
    ``check_schema`` (formats not asserted), its error given as a ConstraintError at the JSON
    pointer of the keyword at fault. ``sizes`` (from :func:`check_value`): a schema of more
    than :data:`CHUNK_NODES` values is checked in pieces (each subschema over that size cut
    off and checked on its own, as the metaschema checks it), the deadline between them."""
    if isinstance(schema, bool):
        return
    from .metaschema import draft_name, metaschema_valid

    draft = draft_name(schema)
    sizes = sizes or {}
    with headroom():
        if metaschema_valid(schema, draft, sizes.get(id(schema), 1)):
            return  # (the fast check: jsonschema's walk below only names an error)
    import jsonschema

    cls = getattr(jsonschema, draft)  # (metaschema_class, from the draft already read)
    single, maps, lists = APPLICATORS.get(draft, APPLICATORS["Draft202012Validator"])
    validator = jsonschema_validator(cls)
    work: list[tuple[object, tuple]] = [(schema, ())]
    passed: set[str] = set()  # pieces found valid (a big schema repeats its subschemas)
    with headroom():
        while work:
            node, path = work.pop()
            if past_deadline(deadline):
                raise out_of_time("metaschema check", limits, path=pointer(path))
            if path:  # a piece
                key = json.dumps(node, sort_keys=True)
                if key in passed:
                    continue
                passed.add(key)
            if isinstance(node, dict) and sizes.get(id(node), 0) > CHUNK_NODES:
                node = _cut(node, path, single, maps, lists, work, sizes)
            try:
                error = next(iter(validator.iter_errors(node)), None)
            except BaseException as e:  # (a Rust panic of jsonschema's referencing included)
                if not is_recursion_error(e):
                    raise
                raise ConstraintTooComplex(
                    "schema nests too deeply for the metaschema check",
                    bound="max_schema_nesting",
                    path=pointer(path),
                ) from None
            if error is not None:
                import jsonschema

                error = jsonschema.exceptions.best_match([error])
                draft = DRAFTS.get(cls.__name__, cls.__name__)
                raise ConstraintError(
                    f"invalid JSON Schema ({draft} metaschema): {_message(error)}",
                    path=pointer([*path, *error.absolute_path]),
                )


def _message(error) -> str:
    msg = error.message
    return msg if len(msg) <= 200 else msg[:197] + "..."


def _cut(node: dict, path: tuple, single, maps, lists, work: list, sizes: dict) -> dict:
    """``node`` without its subschemas (queued in ``work`` to be checked on their own):
    each single one replaced by ``{}``, dropped from a map (the metaschemas constrain only a
    map's values), and a list of nothing but subschemas cut to ``[{}]`` (a list is only
    required to be non-empty; one with other items keeps them, placeholders between)."""
    out = dict(node)
    for k in single:
        x = node.get(k)
        if isinstance(x, dict) and x:
            out[k] = {}
            work.append((x, (*path, k)))
    for k in maps:
        m = node.get(k)
        if isinstance(m, dict) and any(isinstance(x, dict) for x in m.values()):
            for name, x in m.items():
                if isinstance(x, dict):
                    work.append((x, (*path, k, name)))
            out[k] = {name: x for name, x in m.items() if not isinstance(x, dict)}
    for k in lists:
        m = node.get(k)
        if isinstance(m, list) and any(isinstance(x, dict) for x in m):
            for i, x in enumerate(m):
                if isinstance(x, dict):
                    work.append((x, (*path, k, i)))
            out[k] = (
                [{}] if all(isinstance(x, dict) for x in m) else [{} if isinstance(x, dict) else x for x in m]
            )
    return out


_VALIDATORS: dict[type, object] = {}


def jsonschema_validator(cls):
    """A validator of ``cls``'s metaschema (formats not asserted), made once per draft."""
    v = _VALIDATORS.get(cls)
    if v is None:
        import jsonschema

        meta_cls = jsonschema.validators.validator_for(cls.META_SCHEMA, default=cls)
        v = _VALIDATORS[cls] = meta_cls(cls.META_SCHEMA, format_checker=None)
    return v


def _too_deep(max_nesting: int, path: str) -> ConstraintTooComplex:
    return ConstraintTooComplex(
        f"schema nests objects and arrays over {max_nesting} deep (Limits.max_schema_nesting)",
        bound="max_schema_nesting",
        path=path,
    )
