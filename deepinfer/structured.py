"""Structured generation: compile a request's constraint (once, shared through the
compiler's cache), give the request a matcher, and judge the finished output (json.loads +
jsonschema, lark and membership, independently of the automaton; a regex by a fresh walk of
its compiled automaton, linear in the output, where ``re`` could backtrack for minutes).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from typing import Any

from .sampling_params import SamplingParams


def resolve_grammar(spec: str) -> str:
    """Grammar text from a packaged name ("sql"), a file path, or the text itself."""
    from . import grammars

    if "\n" not in spec and (os.path.exists(spec) or ":" not in spec or spec.endswith(".lark")):
        # a name or a path (grammar text always has a rule "name: ..."): a missing one is a
        # ValueError naming the packaged grammars
        return grammars.load(spec)
    return spec


def schema_dict(schema: Any) -> Any:
    """The JSON Schema as a dict (or bool) for validation (the constraints' one loader)."""
    from .constraints.json_schema.loader import load_schema

    return load_schema(schema)


class Structured:
    """The engine's link to the constraint compiler (one per LLM; compiler made lazily)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._compiler = None

    @property
    def compiler(self):
        if self._compiler is None:
            from .constraints import Compiler

            self._compiler = Compiler(self._tokenizer.vocabulary(self._vocab_size))
        return self._compiler

    def compile(self, p: SamplingParams):
        """The shared compiled constraint of ``p`` (ConstraintError / ValueError if bad)."""
        kind = p.constraint_kind
        c = self.compiler
        if kind == "json_schema":
            return c.json_schema(p.json_schema, whitespace=p.whitespace, strict=p.strict, lenient=p.lenient)
        if kind == "regex":
            return c.regex(p.regex)
        if kind == "grammar":
            return c.grammar(resolve_grammar(p.grammar), start=p.grammar_start)
        if kind == "choice":
            return c.choice(p.choice)
        raise ValueError("SamplingParams has no constraint")

    def matcher(self, compiled):
        from .constraints import Matcher

        return Matcher(compiled)


def judge(p: SamplingParams, text: str, finish_reason: str, compiled: Any = None) -> tuple[Any, str | None]:
    """(parsed, error) for a finished constrained output. Never raises: a check that fails
    is the request's error."""
    try:
        return _judge(p, text, finish_reason, compiled)
    except RecursionError:
        return None, "the output is nested too deeply to check"
    except Exception as e:
        return None, f"the output could not be checked: {type(e).__name__}: {e}"


def _judge(p: SamplingParams, text: str, finish_reason: str, compiled: Any) -> tuple[Any, str | None]:
    if finish_reason == "length":
        return None, "max_tokens reached before the constraint was complete"
    kind = p.constraint_kind
    if kind == "json_schema":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            return None, f"output is not JSON: {e}"
        import jsonschema

        schema = schema_dict(p.json_schema)
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(obj), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            where = "/".join(str(x) for x in e.absolute_path)
            return None, f"output does not validate at /{where}: {e.message}"
        model = p.json_schema
        if isinstance(model, type) and hasattr(model, "model_validate"):
            try:
                return model.model_validate(obj), None
            except Exception as e:  # pydantic.ValidationError
                return None, f"output does not validate against {model.__name__}: {e}"
        return obj, None
    if kind == "regex":
        # the compiled automaton walked afresh: linear in the output
        ok = compiled is not None and compiled.accepts(text)
        return (text, None) if ok else (None, "output does not match the regex")
    if kind == "choice":
        return (text, None) if text in p.choice else (None, "output is not one of the choices")
    if kind == "grammar":
        try:
            parser = _lark(resolve_grammar(p.grammar), p.grammar_start)
        except Exception:
            # lark's Earley refuses some grammars we compile (zero-width terminals): the
            # automaton's own verdict (the output ended where the grammar may end) stands
            return text, None
        try:
            parser.parse(text)
        except Exception as e:
            return None, f"output does not parse with the grammar: {str(e).splitlines()[0]}"
        return text, None
    return None, None


@lru_cache(maxsize=32)
def _lark(text: str, start: str):
    import lark

    return lark.Lark(text, start=start, parser="earley", lexer="dynamic_complete")


class MaskFiller:
    """Fills the constrained rows' bitmasks on a host thread while the device runs the
    forward pass (the walks are numba code that releases the GIL; so do torch's ops).

    ``start(seqs)`` before the forward, ``wait()`` after it: returns the host bitmask
    (pinned on CUDA) and the indices of the rows that have a constraint. Statistics:
    ``mask_seconds`` (time spent filling) and ``wait_seconds`` (time the step loop waited
    for it after the forward): the hidden share is ``1 - wait / mask``.
    """

    def __init__(self, vocab_size: int, *, pin: bool, inline: bool = False) -> None:
        self.width = (vocab_size + 31) // 32
        self.pin = pin
        # inline: fill in wait(), on the caller's thread, after the forward was launched
        # (on CUDA the launch returns at once, so the fill overlaps the device step with no
        # thread hand-off); otherwise a worker thread fills from start() on (CPU forward)
        self.inline = inline
        self._buf = None
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._pending: tuple | None = None
        self._launched = None  # CUDA event recorded after the forward's launch (inline)
        self.mask_seconds = 0.0
        self.wait_seconds = 0.0
        self.steps = 0

    def _host(self, B: int):
        import torch

        if self._buf is None or self._buf.shape[0] < B:
            self._buf = torch.empty((max(B, 64), self.width), dtype=torch.int32, pin_memory=self.pin)
        return self._buf[:B]

    def start(self, seqs: list) -> MaskFiller:
        self._future = None
        self._pending = None
        self._launched = None
        if any(s.constraint is not None for s in seqs):
            host = self._host(len(seqs))
            if self.inline:
                self._pending = (seqs, host)
                return self
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="deepinfer-masks")
            self._future = self._pool.submit(self._fill, seqs, host)
        return self

    def _fill(self, seqs: list, host) -> tuple[Any, list[int]]:
        t0 = time.perf_counter()
        rows = host.numpy()
        constrained = [i for i, s in enumerate(seqs) if s.fill_bitmask(rows[i])]
        self.mask_seconds += time.perf_counter() - t0
        return host, constrained

    def launched(self) -> None:
        """Note that the device forward was just launched (inline mode measures overlap)."""
        if self.inline and self._pending is not None:
            import torch

            if not torch.cuda.is_available():
                return
            self._launched = torch.cuda.Event()
            self._launched.record()

    def wait(self) -> tuple[Any, list[int]]:
        if self._pending is not None:
            seqs, host = self._pending
            self._pending = None
            t0 = time.perf_counter()
            out = self._fill(seqs, host)
            if self._launched is not None and self._launched.query():
                # the device had finished: count the fill as not hidden (a lower bound)
                self.wait_seconds += time.perf_counter() - t0
            self.steps += 1
            return out
        if self._future is None:
            return None, []
        t0 = time.perf_counter()
        out = self._future.result()
        self.wait_seconds += time.perf_counter() - t0
        self.steps += 1
        return out

    def reset_stats(self) -> None:
        self.mask_seconds = self.wait_seconds = 0.0
        self.steps = 0
