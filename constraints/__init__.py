"""deepinfer.constraints: regexes, JSON Schemas and Lark grammars → token bitmasks.

Depends on numpy, numba, lark, interegular and jsonschema; never on torch or the engine.

>>> vocab = Vocabulary.from_tokenizer(tokenizer)           # doctest: +SKIP
>>> compiled = Compiler(vocab).json_schema(MyModel)        # doctest: +SKIP
>>> m = Matcher(compiled); m.fill_bitmask(mask, row=0)     # doctest: +SKIP
"""

from .bitmask import allocate_bitmask, apply_bitmask_, bitmask_width, unpack_bitmask
from .compiled import CompiledConstraint
from .compiler import Compiler
from .errors import ConstraintError, ConstraintTooComplex
from .matcher import Matcher
from .vocab import Vocabulary

__all__ = [
    "CompiledConstraint",
    "Compiler",
    "ConstraintError",
    "ConstraintTooComplex",
    "Matcher",
    "Vocabulary",
    "allocate_bitmask",
    "apply_bitmask_",
    "bitmask_width",
    "unpack_bitmask",
]
