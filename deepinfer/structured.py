"""Structured generation: compile a request's constraint (once, shared through the
compiler's cache), give the request a matcher, and judge the finished output (json.loads +
jsonschema, lark and membership, independently of the automaton; a regex by a fresh walk of
its compiled automaton, linear in the output, where ``re`` could backtrack for minutes).
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import torch

from .sample_args import SampleArgs, buffer_words
from .sampling_params import SamplingParams
from .sequence import write_mask


def resolve_grammar(spec: str) -> str:
    """Grammar text from a packaged name ("sql"), a file path, or the text itself."""
    from . import grammars

    if "\n" not in spec and (
        os.path.exists(spec) or ":" not in spec or spec.endswith(".lark") or spec.endswith(".gbnf")
    ):
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
        self.setup_seconds = 0.0  # building the compiler: the Vocabulary, its tries, shared rows

    @property
    def compiler(self):
        if self._compiler is None:
            from .constraints import Compiler

            t0 = time.perf_counter()
            tok = self._tokenizer
            names = {t: i for i in tok.special_token_ids if (t := tok.id_to_token(i)) is not None}
            self._compiler = Compiler(tok.vocabulary(self._vocab_size), special_tokens=names)
            self.setup_seconds = time.perf_counter() - t0
        return self._compiler

    def compile(self, p: SamplingParams):
        """The shared compiled constraint of ``p`` (ConstraintError / ValueError if bad)."""
        if p.reasoning is not None:
            begin, end = self.reasoning_markers(p)
            after = constraint_spec(p)
            return self.compiler.reasoning(after, begin=begin, end=end, max_tokens=p.max_reasoning_tokens)
        kind = p.constraint_kind
        c = self.compiler
        if kind == "structural_tags":
            return c.structural_tags(
                resolved_tags(p.structural_tags, p.key_order),
                p.triggers,
                min_segments=p.min_segments,
                max_segments=p.max_segments,
            )
        if kind == "json_schema":
            return c.json_schema(
                p.json_schema,
                whitespace=p.whitespace,
                strict=p.strict,
                lenient=p.lenient,
                key_order=p.key_order,
            )
        if kind == "regex":
            return c.regex(p.regex)
        if kind == "grammar" and p.grammar_dialect == "gbnf":
            start = "root" if p.grammar_start == "start" else p.grammar_start
            return c.gbnf(resolve_grammar(p.grammar), start=start)
        if kind == "grammar":
            return c.grammar(resolve_grammar(p.grammar), start=p.grammar_start)
        if kind == "choice":
            return c.choice(p.choice)
        raise ValueError("SamplingParams has no constraint")

    def reasoning_markers(self, p: SamplingParams) -> tuple[str, str]:
        """``p.reasoning``'s (begin, end): given, or the tokenizer's think tokens for True."""
        if p.reasoning is True:
            tok = self._tokenizer
            if tok.token_to_id("<think>") is None or tok.token_to_id("</think>") is None:
                raise ValueError(
                    "reasoning=True: the tokenizer has no <think> and </think> tokens; give the "
                    "markers as reasoning=(begin, end)"
                )
            return "<think>", "</think>"
        return p.reasoning  # type: ignore[return-value]

    def matcher(self, compiled):
        from .constraints import Matcher

        return Matcher(compiled)


def constraint_spec(p: SamplingParams) -> dict | None:
    """``p``'s constraint as the compiler's constraint dict (``Compiler.lower``), or None."""
    kind = p.constraint_kind
    if kind == "json_schema":
        return {
            "json_schema": p.json_schema,
            "whitespace": p.whitespace,
            "strict": p.strict,
            "lenient": p.lenient,
            "key_order": p.key_order,
        }
    if kind == "regex":
        return {"regex": p.regex}
    if kind == "grammar" and p.grammar_dialect == "gbnf":
        start = "root" if p.grammar_start == "start" else p.grammar_start
        return {"grammar": resolve_grammar(p.grammar), "start": start, "syntax": "gbnf"}
    if kind == "grammar":
        return {"grammar": resolve_grammar(p.grammar), "start": p.grammar_start}
    if kind == "choice":
        return {"choice": list(p.choice)}
    if kind == "structural_tags":
        return {
            "structural_tags": resolved_tags(p.structural_tags, p.key_order),
            "triggers": p.triggers,
            "min_segments": p.min_segments,
            "max_segments": p.max_segments,
        }
    return None


def resolved_tags(tags: list[dict], key_order: str = "schema") -> list[dict]:
    """Structural tags with each grammar given as text (a packaged name or a file path read),
    and the request's ``key_order`` on each JSON schema tag that sets none."""
    out = []
    for t in tags:
        if isinstance(t.get("grammar"), str):
            t = {**t, "grammar": resolve_grammar(t["grammar"])}
        if key_order != "schema" and t.get("json_schema") is not None and "key_order" not in t:
            t = {**t, "key_order": key_order}
        out.append(t)
    return out


def split_reasoning(p: SamplingParams, markers: tuple[str, str], text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of an output with a reasoning block: the text between the markers
    and the text after the end marker (None and the whole text without ``reasoning``; an
    unfinished block: its text and "")."""
    if p.reasoning is None:
        return None, text
    begin, end = markers
    body = text[len(begin) :] if begin and text.startswith(begin) else text
    at = body.find(end)
    if at < 0:
        return body, ""
    return body[:at], body[at + len(end) :]


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
        if p.constraint_kind == "structural_tags" and p.reasoning is None and p.min_segments == 0:
            # free text cut short is free text: only a segment cut short is invalid
            segments, error = check_segments(text, p.structural_tags, p.triggers)
            if error is None:
                return segments, None
        return None, "max_tokens reached before the constraint was complete"
    if p.reasoning is not None:
        # the whole output is the automaton's (markers, block, constraint): walked afresh; the
        # answer after the block is judged below as the constraint's own output
        # (special-token markers are not in the decoded text: the walk is skipped for them)
        if compiled is not None and not compiled.specials and not compiled.accepts(text):
            return None, "output is not a reasoning block followed by the constraint"
        markers = getattr(compiled, "markers", None) or ("<think>", "</think>")
        text = split_reasoning(p, markers, text)[1]
        compiled = None
    kind = p.constraint_kind
    if kind == "structural_tags":
        return check_segments(text, p.structural_tags, p.triggers, compiled)
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
        # the compiled automaton walked afresh: linear in the output (after a reasoning
        # block, re.fullmatch on the answer)
        ok = compiled.accepts(text) if compiled is not None else re.fullmatch(p.regex, text) is not None
        return (text, None) if ok else (None, "output does not match the regex")
    if kind == "choice":
        return (text, None) if text in p.choice else (None, "output is not one of the choices")
    if kind == "grammar" and p.grammar_dialect == "gbnf":
        # (no GBNF parser here: the compiled automaton walked afresh, linear in the output)
        ok = compiled is None or compiled.accepts(text)
        return (text, None) if ok else (None, "output does not match the GBNF grammar")
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


# ------------------------------------------------------------------ structural tags


def check_segments(text: str, tags: list[dict], triggers: list[str] | None, compiled: Any = None):
    """(segments, error) of a finished output under structural tags, judged independently of
    the automaton: each segment's content by json.loads + jsonschema, ``re.fullmatch``, a lark
    parse or membership; the free text holding no trigger. ``segments``: ``[{"tag": i,
    "content": str, "value": parsed JSON or the content}]``."""
    triggers = triggers or list(dict.fromkeys(t["begin"] for t in tags))
    if compiled is not None and not compiled.accepts(text):
        return None, "output does not match the structural tags"
    segments: list[dict] = []
    at = 0
    while True:
        hits = [(k, t) for t in triggers if (k := text.find(t, at)) >= 0]
        if not hits:
            return segments, None
        k, _ = min(hits, key=lambda h: h[0] + len(h[1]))  # the trigger that ends first
        found = None
        for i, tag in enumerate(tags):
            if text.startswith(tag["begin"], k):
                found = _segment(text, k + len(tag["begin"]), i, tag)
                if found is not None:
                    break
        if found is None:
            return None, f"the segment at offset {k} does not match its tag"
        segments.append(found[0])
        if tags[found[0]["tag"]].get("then", "text") == "end":
            rest = text[found[1] :]
            return (segments, None) if not rest else (None, "text after a segment that ends the output")
        at = found[1]


def _segment(text: str, start: int, i: int, tag: dict) -> tuple[dict, int] | None:
    """The segment of ``tag`` whose content starts at ``start``: (segment, end offset), or None."""
    end = tag["end"]
    k = text.find(end, start)
    while k >= 0:
        content = text[start:k]
        value = _judge_content(tag, content)
        if value is not _NO:
            return {"tag": i, "content": content, "value": value}, k + len(end)
        k = text.find(end, k + 1)
    return None


_NO = object()


def _judge_content(tag: dict, content: str) -> Any:
    if tag.get("json_schema") is not None:
        import jsonschema

        try:
            value = json.loads(content)
        except json.JSONDecodeError:
            return _NO
        errors = jsonschema.Draft202012Validator(schema_dict(tag["json_schema"])).iter_errors(value)
        return _NO if next(errors, None) is not None else value
    if tag.get("regex") is not None:
        return content if re.fullmatch(tag["regex"], content, tag.get("flags", 0)) else _NO
    if tag.get("choice") is not None:
        return content if content in tag["choice"] else _NO
    if tag.get("grammar") is not None:
        try:
            _lark(resolve_grammar(tag["grammar"]), tag.get("start", "start")).parse(content)
        except Exception:  # noqa: BLE001 - lark's parse or grammar errors: not this segment
            return _NO
        return content
    return content if tag["end"] not in content else _NO


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
    for it after the forward): the hidden share is ``1 - wait / mask``; ``recent``: a step's
    fill lately (an average that halves the weight of each older step), which the CPU's
    thread policy weighs against the step (``_threads.host_needs_core``).

    A row of the buffer is written only when its content changes: the filler keeps, per row,
    the matcher's row it copied there last (``_kept``), and a row whose sequence gives the same
    one again (a string's interior, say, where one cached row serves every step) is left as it
    is. That record holds for one batch size's views: another batch size's rows lie elsewhere
    in the buffer, so a change of views starts it afresh.
    """

    def __init__(self, vocab_size: int, *, pin: bool, inline: bool = False) -> None:
        self.width = (vocab_size + 31) // 32
        self.pin = pin
        # inline: fill in wait(), on the caller's thread, after the forward was launched
        # (on CUDA the launch returns at once, so the fill overlaps the device step with no
        # thread hand-off); otherwise a worker thread fills from start() on (CPU forward)
        self.inline = inline
        self._buf = None
        self._views: dict[int, SampleArgs] = {}  # B -> the buffer's views for B rows
        self._kept: list = []  # per row of _kept_views: the mask row last copied there (or None)
        self._kept_views: SampleArgs | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._pending: tuple | None = None
        self._launched = None  # CUDA event recorded after the forward's launch (inline), or None
        self._event = None  # that event (one, recorded again each step); False without CUDA
        self.mask_seconds = 0.0
        self.wait_seconds = 0.0
        self.steps = 0
        self.recent = 0.0

    def args(self, B: int) -> SampleArgs:
        """The buffer's views for ``B`` rows: the bitmask's rows (the ones ``wait`` returns)
        after the sampler's per-row arguments, which go in beside them (one copy to the device:
        ``sample_args.py``). Made once per ``B`` (a step's slicing and numpy conversion of a
        tensor cost the host more than the fill of a warm row)."""
        views = self._views.get(B)
        if views is None:
            if self._buf is None or self._buf.numel() < buffer_words(B, self.width):
                n = buffer_words(max(B, 64), self.width)
                self._buf = torch.empty(n, dtype=torch.int32, pin_memory=self.pin)
                self._views.clear()
            views = self._views[B] = SampleArgs(self._buf, B, self.width)
        return views

    def start(self, seqs: list) -> MaskFiller:
        self._future = None
        self._pending = None
        self._launched = None
        if any(s.constraint is not None for s in seqs):
            host = self.args(len(seqs))
            if self.inline:
                self._pending = (seqs, host)
                return self
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="deepinfer-masks")
            self._future = self._pool.submit(self._fill, seqs, host)
        return self

    @property
    def active(self) -> bool:
        """Has this step rows to fill (a row with a constraint)?"""
        return self._pending is not None or self._future is not None

    def _fill(self, seqs: list, args: SampleArgs) -> tuple[Any, list[int]]:
        t0 = time.perf_counter()
        rows = args.rows_np
        if self._kept_views is not args:  # (a new buffer, or another batch size's views)
            self._kept_views, self._kept = args, [None] * len(seqs)
        kept = self._kept
        constrained = []
        for i, s in enumerate(seqs):
            src = s.mask_source()
            if src is None:
                continue
            constrained.append(i)
            if kept[i] is not src:  # (else the row holds it already)
                write_mask(rows[i], src)
                kept[i] = src
        dt = time.perf_counter() - t0
        self.mask_seconds += dt
        self.recent += 0.5 * (dt - self.recent)
        return args.rows, constrained

    def launched(self) -> None:
        """Note that the device forward was just launched (inline mode measures overlap)."""
        if self.inline and self._pending is not None:
            if self._event is None:
                self._event = torch.cuda.Event() if torch.cuda.is_available() else False
            if self._event is not False:
                self._event.record()
                self._launched = self._event

    def wait(self, *, hidden: bool = False) -> tuple[Any, list[int]]:
        """(the host bitmask, the constrained rows' indices) of this step, filled now (inline)
        or waited for (worker thread). ``hidden``: the caller is a thread of its own that the
        step loop does not wait on (DSpark's mask thread), so no time counts as waited."""
        if self._pending is not None:
            seqs, host = self._pending
            self._pending = None
            t0 = time.perf_counter()
            out = self._fill(seqs, host)
            if not hidden and self._launched is not None and self._launched.query():
                # the device had finished: count the fill as not hidden (a lower bound)
                self.wait_seconds += time.perf_counter() - t0
            self.steps += 1
            return out
        if self._future is None:
            return None, []
        t0 = time.perf_counter()
        out = self._future.result()
        if not hidden:
            self.wait_seconds += time.perf_counter() - t0
        self.steps += 1
        return out

    def reset_stats(self) -> None:
        self.mask_seconds = self.wait_seconds = 0.0
        self.steps = 0
