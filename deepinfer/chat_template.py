"""ChatTemplate: a model's Jinja chat template, rendered in a sandbox with a time and size bound.

The template comes with the model (GGUF metadata or tokenizer_config.json), so it is input
like any other: it must not run code (Jinja's immutable sandbox), loop for ever, or build a
string of gigabytes. Rendering is bounded three ways:

- **time**: a trace hook on the template's own frames checks a deadline at every line it runs
  (loops included), so a template that never ends fails after ``max_seconds``;
- **size**: every operator and call that can multiply a string or a list (``*``, ``**``,
  ``+``, ``~``, str methods, filters) is checked before it runs: no argument or result may
  pass ``max_chars``, so no single step allocates more than a few times the bound;
- **output**: the rendered text is streamed and refused once it passes ``max_chars``.

A template that passes a bound raises :class:`ChatTemplateError` (a ValueError) naming the
bound; a template that fails on its own (``raise_exception``, an undefined name) raises it with
the template's message and line.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ._text import clip_repr

MAX_SECONDS = 2.0  # rendering one conversation
MAX_CHARS = 4 << 20  # rendered text (and any string or list built on the way)


class ChatTemplateError(ValueError):
    """A chat template that failed, or passed its time or size bound."""


class _Bound(Exception):
    """Raised inside the template when a bound is passed (not catchable as a Jinja error)."""


def _size(x: Any) -> int:
    return len(x) if isinstance(x, str | bytes | list | tuple | dict) else 0


class ChatTemplate:
    """One compiled template; ``render`` is thread-safe (each call has its own deadline)."""

    def __init__(self, source: str, *, max_seconds: float = MAX_SECONDS, max_chars: int = MAX_CHARS) -> None:
        self.source = source
        self.max_seconds = max_seconds
        self.max_chars = max_chars
        env = _environment(self)
        try:
            self._template = env.from_string(source)
        except Exception as e:  # jinja2.TemplateSyntaxError: names the line
            line = getattr(e, "lineno", None)
            at = f" (line {line})" if line else ""
            raise ChatTemplateError(f"chat template does not compile{at}: {e}") from None

    # -- bounds (called from inside the sandbox) ----------------------------------------------
    def _check(self, *values: Any) -> None:
        limit = self.max_chars
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > limit:
                raise _Bound(
                    f"a number ({v}) larger than the size bound {limit} reached a string or list operation"
                )
            if _size(v) > limit:
                raise _Bound(f"a value of {_size(v)} items passed the size bound {limit}")

    def render(self, messages: Sequence[dict], **variables: Any) -> str:
        deadline = time.monotonic() + self.max_seconds
        code = self._codes()
        limit = self.max_chars

        def local(frame, event, arg):
            if time.monotonic() > deadline:
                raise _Bound(f"rendering took longer than {self.max_seconds:g} s")
            if event == "return" and _size(arg) > limit:  # e.g. `~` joining in a loop
                raise _Bound(f"a value of {_size(arg)} items passed the size bound {limit}")
            return local

        def tracer(frame, event, arg):
            if frame.f_code in code or frame.f_code.co_filename == "<template>":
                if time.monotonic() > deadline:
                    raise _Bound(f"rendering took longer than {self.max_seconds:g} s")
                return local
            return None

        out: list[str] = []
        n = 0
        old = sys.gettrace()
        sys.settrace(tracer)
        try:
            for chunk in self._template.generate(messages=list(messages), **variables):
                n += len(chunk)
                if n > limit:
                    raise _Bound(f"the rendered prompt passed {limit} characters")
                out.append(chunk)
        except _Bound as e:
            raise ChatTemplateError(f"chat template refused: {e}") from None
        except ChatTemplateError:
            raise
        except RecursionError:
            raise ChatTemplateError("chat template refused: it recursed too deeply") from None
        except MemoryError:
            raise ChatTemplateError("chat template refused: it ran out of memory") from None
        except Exception as e:
            line = _template_line(e)
            at = f" (line {line})" if line else ""
            raise ChatTemplateError(f"chat template failed{at}: {type(e).__name__}: {e}") from None
        finally:
            sys.settrace(old)
        return "".join(out)

    @staticmethod
    def _codes() -> frozenset:
        """Code objects of Jinja's runtime helpers whose loops the deadline must also see."""
        global _RUNTIME_CODES
        if _RUNTIME_CODES is None:
            from jinja2 import filters, runtime, utils

            codes = set()
            for mod in (runtime, filters, utils):
                for v in vars(mod).values():
                    f = getattr(v, "__code__", None)
                    if f is not None:
                        codes.add(f)
            _RUNTIME_CODES = frozenset(codes)
        return _RUNTIME_CODES


_RUNTIME_CODES: frozenset | None = None


def _template_line(e: BaseException) -> int | None:
    tb = e.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return getattr(e, "lineno", None) or line


def _environment(owner: ChatTemplate):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "//", "%"})

        def call_binop(self, context, operator, left, right):
            if operator == "**":
                if _is_number(left) and _is_number(right) and abs(left) > 1:
                    bits = abs(right) * math.log2(abs(left)) if math.isfinite(right) else math.inf
                    if bits > 64 * owner.max_chars:  # a number as long as the text may be
                        raise _Bound(
                            f"{clip_repr(left, 40)} ** {clip_repr(right, 40)} is past the size bound"
                        )
            elif operator == "*":
                n = right if isinstance(right, int) else left if isinstance(left, int) else None
                seq = left if isinstance(right, int) else right
                if n is not None and _size(seq) * max(n, 0) > owner.max_chars:
                    raise _Bound(
                        f"repeating {_size(seq)} items {n} times passes the size bound {owner.max_chars}"
                    )
            elif operator == "+" and _size(left) + _size(right) > owner.max_chars:
                raise _Bound(f"joining {_size(left)} and {_size(right)} items passes the size bound")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's signature)
            owner._check(*args, *kwargs.values())
            result = super().call(__context, __obj, *args, **kwargs)
            owner._check(result)
            return result

    env = Env(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise ChatTemplateError(f"chat template error: {message}")

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(str(fmt)[:256])
    # filters and `~` run Python helpers directly (not through call()): bound their inputs
    for name, f in list(env.filters.items()):
        env.filters[name] = _bounded_filter(owner, f)
    return env


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _bounded_filter(owner: ChatTemplate, f):
    import functools

    @functools.wraps(f)
    def bounded(*args, **kwargs):
        owner._check(*(a for a in args if not _is_context(a)), *kwargs.values())
        result = f(*args, **kwargs)
        owner._check(result)
        return result

    return bounded


def _is_context(x: Any) -> bool:
    from jinja2.environment import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return isinstance(x, Context | Environment | EvalContext)
