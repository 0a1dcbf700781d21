"""Shared constants and helpers of the JSON Schema front end (json_schema and its mixins)."""

from __future__ import annotations

import json
import time
from urllib.parse import unquote

from ..errors import ConstraintError
from ..ir import LONG_REPEAT, Alt, Expr, Repeat, Seq
from ..memo import NodeMemo

FLEX_INDENT = 20
# whitespace modes of the JSON Schema front end (see lowering.py)
WHITESPACE = ("compact", "natural", "flexible")
# the default layout: the one that measured best on extraction (benchmarks/bench_quality.py)
DEFAULT_WHITESPACE = "flexible"
MAX_DEPTH = 64  # nested schema levels while compiling
MAX_ENUM = 10_000  # enum values
MAX_REPEAT_COST = 400_000  # IR nodes a counted repetition may expand to
MAX_LENGTH_COUNT = 4_096  # minLength/maxLength counted by an automaton
MAX_PATTERN_PROPERTIES = 4  # patternProperties resolved exactly (2**n key classes)
MAX_BRANCHES = 256  # anyOf x anyOf products while merging allOf

ANNOTATIONS = {
    "title",
    "description",
    "examples",
    "default",
    "$comment",
    "$schema",
    "$id",
    "id",
    "readOnly",
    "writeOnly",
    "deprecated",
    "contentMediaType",
    "contentEncoding",
    "contentSchema",
    "$defs",
    "definitions",
    "$anchor",
    "$dynamicAnchor",
    "$vocabulary",
    "format",
    "discriminator",
    "nullable",
}
UNSUPPORTED = (
    "uniqueItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "minContains",
    "maxContains",
    "dependentSchemas",
    "dependentRequired",
    "dependencies",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
)
SUPPORTED = (
    "type",
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "definitions",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
)
TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")
ORIGIN = "\x00origin"  # merged schemas remember the node they came from (for enum filtering)
PATTERNS = "\x00patterns"
ADDL = "\x00addl"  # [(patterns, schema)]: undeclared keys matching none of the patterns take schema
CONTAINS = "\x00contains"  # a second contains merged under allOf (met by its own item, or the same)


def child(ptr: str, *keys: object) -> str:
    for k in keys:
        ptr += "/" + str(k).replace("~", "~0").replace("/", "~1")
    return ptr


MISSING = object()  # (pointer_step: no such member)


def pointer_keys(frag: str) -> list[str]:
    """The reference tokens of a JSON pointer fragment, decoded ("/a/b~1c%25" -> ["a", "b/c%"])."""
    return [unquote(raw).replace("~1", "/").replace("~0", "~") for raw in frag.split("/")[1:]]


def pointer_step(node: object, key: str) -> object:
    """``node``'s member ``key`` (an object's key, an array's index), or MISSING."""
    if isinstance(node, dict):
        return node.get(key, MISSING)
    if isinstance(node, list) and key.isdigit() and int(key) < len(node):
        return node[int(key)]
    return MISSING


def is_trivial(s: object) -> bool:
    """True for schemas that accept everything (``true``, ``{}``, annotations only)."""
    return s is True or (isinstance(s, dict) and all(k in ANNOTATIONS - {"format"} for k in s))


def constraining(s: dict) -> dict:
    return {k: v for k, v in s.items() if k not in ANNOTATIONS or k == "format"}


def json_type(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def canon(v: object) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return json.dumps(v, sort_keys=True)


def join(items: list[Expr], sep: Expr) -> list[Expr]:
    out: list[Expr] = []
    for i, x in enumerate(items):
        if i:
            out.append(sep)
        out.append(x)
    return out


def counted_item(item: Expr) -> bool:
    """Whether the automaton counts a long repetition of ``item`` instead of copying it
    (a Ref-free, prefix-free item: see :mod:`..automaton.counted`)."""
    from ..automaton.counted import item_dfa
    from ..automaton.nfa import Limits

    try:
        return item_dfa(item, Limits(), time.monotonic() + 1.0) is not None
    except ConstraintError:
        return False


def repeat_cost(item: Expr, n: int) -> int:
    """IR nodes that ``n`` repetitions of ``item`` expand to: one copy where the automaton
    counts them (:func:`counted_item`), else ``n``."""
    return cost(item) * (1 if n > LONG_REPEAT and counted_item(item) else n)


def cost(e: Expr, memo: dict | None = None) -> int:
    """Rough IR size with counted repetitions expanded (shared nodes counted once; a
    long repetition the automaton counts, see :func:`counted_item`, counts one copy)."""
    memo = {} if memo is None else memo
    if id(e) in memo:
        return 1
    if isinstance(e, (Seq, Alt)):
        n = 1 + sum(cost(x, memo) for x in e.items)
    elif isinstance(e, Repeat):
        copies = max(1, e.max if e.max is not None else e.min)
        if copies > LONG_REPEAT and counted_item(e.item):
            copies = 1
        n = 1 + cost(e.item, memo) * copies
    else:
        n = 1
    memo[id(e)] = (e, n)
    return n


def cost_over(e: Expr, bound: int) -> bool:
    """``cost(e) > bound``, visiting at most about ``bound`` nodes (the lowering asks it of
    every object value and branch: a whole walk each time is quadratic in the nesting);
    kept per expression (values recur across schemas)."""
    key = (e, bound)
    hit = _OVER.get(key)
    if hit is None:
        hit = _OVER.put(key, _capped_cost(e, {}, bound + 1) > bound, e._size)
    return hit


_OVER = NodeMemo(20_000)


def _capped_cost(e: Expr, memo: dict, cap: int) -> int:
    """:func:`cost`, or a number >= ``cap`` once the count reaches ``cap``."""
    if id(e) in memo:
        return 1
    t = type(e)
    if t is Seq or t is Alt:
        n = 1
        for x in e.items:
            n += _capped_cost(x, memo, cap - n)
            if n >= cap:
                return n
    elif t is Repeat:
        copies = max(1, e.max if e.max is not None else e.min)
        if copies > LONG_REPEAT and counted_item(e.item):
            copies = 1
        n = 1 + _capped_cost(e.item, memo, -(-(cap - 1) // copies)) * copies
    else:
        n = 1
    memo[id(e)] = (e, n)
    return n


def escaped_at(p: str, i: int) -> bool:
    n = 0
    while i - 1 - n >= 0 and p[i - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


def _top_chars(p: str):
    """(position, character, group depth) of each character of regex ``p`` that is neither
    escaped, inside a ``[...]`` class, nor a parenthesis."""
    depth, cls, i = 0, False, 0
    while i < len(p):
        c = p[i]
        if c == "\\":
            i += 2
            continue
        if cls:
            if c == "]":
                cls = False
        elif c == "[":
            cls = True
            if p[i + 1 : i + 2] == "]" or p[i + 1 : i + 3] == "^]":
                i += 2 if p[i + 1] == "]" else 3
                continue
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        else:
            yield i, c, depth
        i += 1


def split_top(p: str) -> list[str]:
    """Split a regex at its top-level ``|`` (outside groups and classes)."""
    out, start = [], 0
    for i, c, depth in _top_chars(p):
        if c == "|" and depth == 0:
            out.append(p[start:i])
            start = i + 1
    out.append(p[start:])
    return out


_REGEX_SPECIAL = set("\\^$.|?*+()[]{}")
_QUANTIFIERS = set("?*+{")


def impossible_anchor(branch: str) -> bool:
    """Whether a top-level regex branch provably matches nothing because of an anchor:
    it opens with a mandatory literal (``/`` in a JS-style ``"/^...$/"``) and later has a
    top-level ``^`` (which, without multiline, only matches at position 0), or it closes with
    a mandatory literal (not a line break) after a top-level ``$`` (only at the end).
    Conservative: False whenever it cannot prove it (groups, classes before the anchor, flags)."""
    if not branch or "(?" in branch:
        return False

    def literal_at(i: int) -> int:
        """Length of a single literal atom at i (plain or escaped punctuation), else 0."""
        c = branch[i]
        if c == "\\":
            return 2 if i + 1 < len(branch) and not branch[i + 1].isalnum() else 0
        return 0 if c in _REGEX_SPECIAL else 1

    # top-level, unescaped, outside-class positions of ^ and $
    top = [(i, c) for i, c, depth in _top_chars(branch) if depth == 0]
    carets = [i for i, c in top if c == "^"]
    dollars = [i for i, c in top if c == "$"]
    n = literal_at(0)
    if n and (n >= len(branch) or branch[n] not in _QUANTIFIERS) and any(p >= n for p in carets):
        return True
    last = len(branch) - 1
    start = last - 1 if last >= 1 and escaped_at(branch, last) else last
    if branch[last] == "\n" or (start == last - 1 and branch[last] in "nrtfv"):
        return False
    m = literal_at(start)
    return bool(m) and start + m == len(branch) and any(p < start for p in dollars)
