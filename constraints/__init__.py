"""deepinfer.constraints: regexes, JSON Schemas and Lark grammars → token bitmasks.

Depends on numpy, numba, lark and jsonschema (pydantic for model classes); never on torch
or the engine.

The stages: front ends (:mod:`.frontends`: regex, Lark; :mod:`.json_schema`) lower a
constraint to the grammar IR (:mod:`.ir`); :mod:`.automaton` compiles the IR to a
byte-level pushdown automaton; :mod:`.tokens` walks the vocabulary trie from its states;
:mod:`.compiled` joins the automaton to the vocabulary (mask rows), :mod:`.matcher` walks
one request through it and :mod:`.tag_check` wraps the matcher with a run-time check
(uniqueItems: :mod:`.unique_items`; keys in any order: :mod:`.key_order`);
:mod:`.compiler` drives it all, within the bounds of :class:`~.limits.Limits` (sizes,
nesting, time: every refusal is a :class:`ConstraintError` naming where). Imports
form no cycle: :mod:`.ir` and :mod:`.errors` import nothing of the package, :mod:`.limits`
only :mod:`.errors`, :mod:`.automaton` only them, the front ends
also the automaton (the JSON Schema lowering asks it whether a repetition is counted and
whether a key language is empty), :mod:`.tokens` the automaton's kernels, and each
top-level module only the stages before it.

>>> vocab = Vocabulary.from_tokenizer(tokenizer)           # doctest: +SKIP
>>> compiled = Compiler(vocab).json_schema(MyModel)        # doctest: +SKIP
>>> m = Matcher(compiled); m.fill_bitmask(mask, row=0)     # doctest: +SKIP
"""

from .bitmask import allocate_bitmask, apply_bitmask_, bitmask_width, unpack_bitmask
from .compiled import CompiledConstraint
from .compiler import Compiler
from .errors import ConstraintError, ConstraintTooComplex
from .json_schema.loader import load_schema
from .limits import Limits
from .matcher import Matcher
from .vocab import Vocabulary

__all__ = [
    "CompiledConstraint",
    "Compiler",
    "ConstraintError",
    "ConstraintTooComplex",
    "Limits",
    "Matcher",
    "Vocabulary",
    "allocate_bitmask",
    "apply_bitmask_",
    "bitmask_width",
    "load_schema",
    "unpack_bitmask",
]
