"""SamplingParams: how one request is decoded. Validates itself on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ._text import clip_repr, lone_surrogate

CONSTRAINT_KINDS = ("json_schema", "regex", "grammar", "choice", "structural_tags")

# Bounds of the values the sampler and the stop checks can take.
MIN_TEMPERATURE = 1e-5  # a temperature below it (but above 0) is greedy: 1/T would overflow
MAX_TEMPERATURE = 1e4
MIN_TOP_P = 1e-8  # a smaller top_p (0 in float32) keeps the same one most likely token
MAX_TOP_K = 1 << 30  # past any vocabulary: the same as off
SEED_RANGE = (-(1 << 63), 1 << 63)  # int64, what the sampler hashes
MAX_STOP = 256  # stop strings
MAX_STOP_CHARS = 1024  # characters of one stop string
MAX_TOKEN_ID = (1 << 31) - 1
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's top_logprobs bound)


def _bad(name: str, value: object, want: str) -> ValueError:
    return ValueError(f"SamplingParams.{name} must be {want}, got {clip_repr(value)}")


@dataclass
class SamplingParams:
    """Decoding settings of one request.

    Parameters
    ----------
    max_tokens : int or None
        Most tokens to generate (None: until the context is full). Default 16.
    temperature : float
        0 is greedy (argmax); otherwise logits are divided by it before sampling.
    top_p, top_k, min_p : float, int, float
        Nucleus mass (1.0 off), top-k count (0 off), probability floor relative to the most
        likely token (0.0 off). They filter jointly.
    seed : int or None
        Same seed, same prompt -> same tokens, whatever else is in the batch.
    stop : str or list of str
        Generation ends when the text ends with one of these; it is cut from the output
        unless `include_stop_str_in_output`.
    stop_token_ids : list of int
        Extra ids that end generation (the model's EOS ids always do unless `ignore_eos`).
    logprobs : int or None
        Return each generated token's log-probability and those of the ``logprobs`` most
        likely tokens at its position (0 to 20; None: none), in ``RequestOutput.logprobs``.
        They are the model's distribution: log-softmax of the logits before the constraint
        mask, temperature and filters. A request with logprobs is not drafted by DSpark.
    json_schema : dict, str, bool or pydantic model class
        The output is a JSON document valid under this schema (`RequestOutput.parsed` holds
        the validated object, or an instance of the pydantic model).
    regex : str
        The output fully matches this Python regex.
    grammar : str
        A Lark EBNF grammar: its text, a file path, or the name of a packaged grammar
        (`deepinfer.grammars.available()`: "json", "sql", "arithmetic", "csv", ...); or a
        GBNF grammar (llama.cpp's dialect): a ``.gbnf`` file or packaged name, or any text
        with ``grammar_syntax="gbnf"``.
    grammar_syntax : "lark", "gbnf" or None
        The dialect of `grammar`; None: GBNF for a name ending in ``.gbnf``, else Lark.
    choice : list of str
        The output is exactly one of these strings.
    whitespace : "flexible" (default), "natural" or "compact"
        JSON Schema only: bounded whitespace in every gap between JSON tokens (at most one line
        break, then up to 20 spaces or tabs); the spaces and line breaks of spaced or
        pretty-printed JSON only (one space or one line break + indent after ``{ [ ,`` and
        before ``} ]``, one space after ``:``); or none. "flexible" is the default because it
        measured best on extraction: the model lays JSON out as it would unasked, and its
        answers stay at or above free text (docs/structured-generation.md, "Whitespace").
        The whitespace is the widest allowed: where it makes a schema's automaton too large,
        the next narrower one is used and ``RequestOutput.relaxed`` says so.
    strict : bool
        JSON Schema only: forbid properties the schema does not declare.
    lenient : bool
        JSON Schema only: relax keywords the grammar cannot enforce (listed in
        `RequestOutput.relaxed`) instead of refusing the schema; the output is still
        validated with jsonschema.
    grammar_start : str
        The start rule of `grammar` (GBNF's is ``root``: the default "start" means ``root`` there).
    key_order : "schema" (default) or "any"
        JSON Schema only: object keys in schema order, or in any order (each declared key at
        most once, the required ones before the object closes; a run-time check). It applies
        to the answer after a reasoning block too, and to each structural tag's schema that
        sets no ``key_order`` of its own.
    structural_tags : list of dict
        Free text in which a trigger starts a tagged segment whose content is constrained
        (tool calls inside text): each tag is ``{"begin": "<tool_call>", "json_schema" |
        "regex" | "grammar" | "choice": ..., "end": "</tool_call>", "then": "text" | "end"}``
        (no content key: any text up to ``end``; ``then``: free text resumes, the default,
        or the output ends). ``deepinfer.tool_calls`` builds them from OpenAI ``tools``.
    triggers : list of str
        The strings that start a segment where they first occur in the free text; each must
        begin some tag's ``begin`` (default: the tags' begins).
    min_segments, max_segments : int, int or None
        How many segments the output holds (default 0 to any; ``max_segments=1``: one call).
    reasoning : bool, (str, str) or None
        A reasoning block first: ``(begin, end)`` markers, or True for the tokenizer's own
        (``<think>``/``</think>`` when it has them, else an error); free text inside, then
        the constraint (or free text). ``RequestOutput.reasoning`` holds the block's text and
        ``.text`` what follows it. ``begin`` may be "" when the prompt opened the block.
    max_reasoning_tokens : int or None
        Tokens the reasoning block may take (its markers included); then its end marker is
        forced.
    speculative : bool or None
        DSpark speculative decoding for this request (drafts verified by the model, so the
        output is unchanged); None follows the LLM's ``dspark`` default.
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None

    # -- structured generation (at most one constraint) ------------------------------------
    json_schema: Any = None
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None
    whitespace: str = "flexible"  # constraints.json_schema.common.DEFAULT_WHITESPACE
    strict: bool = False
    lenient: bool = False
    grammar_start: str = "start"
    grammar_syntax: str | None = None
    key_order: str = "schema"
    structural_tags: list[dict] | None = None
    triggers: list[str] | None = None
    min_segments: int = 0
    max_segments: int | None = None
    reasoning: bool | tuple[str, str] | None = None
    max_reasoning_tokens: int | None = None
    speculative: bool | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1
        ):
            raise _bad("max_tokens", self.max_tokens, "a positive int or None")
        if not _is_real(self.temperature) or not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise _bad("temperature", self.temperature, f"a number in [0, {MAX_TEMPERATURE:g}]")
        if self.temperature < MIN_TEMPERATURE:
            self.temperature = 0.0  # greedy (what sampling tends to as T -> 0)
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise _bad("top_p", self.top_p, "in (0, 1]")
        self.top_p = max(self.top_p, MIN_TOP_P)
        if (
            not isinstance(self.top_k, int)
            or isinstance(self.top_k, bool)
            or not -1 <= self.top_k <= MAX_TOP_K
        ):
            raise _bad("top_k", self.top_k, f"an int in [0, {MAX_TOP_K}] (0 or -1 disables it)")
        if self.top_k == -1:
            self.top_k = 0
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            raise _bad("min_p", self.min_p, "in [0, 1]")
        if self.seed is not None and (
            not isinstance(self.seed, int)
            or isinstance(self.seed, bool)
            or not SEED_RANGE[0] <= self.seed < SEED_RANGE[1]
        ):
            raise _bad("seed", self.seed, "an int64 (in [-2**63, 2**63)) or None")
        stop = [self.stop] if isinstance(self.stop, str) else self.stop if self.stop is not None else []
        if (
            not isinstance(stop, list | tuple)
            or len(stop) > MAX_STOP
            or not all(
                isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS and lone_surrogate(s) is None
                for s in stop
            )
        ):
            raise _bad(
                "stop",
                self.stop,
                f"a non-empty str of at most {MAX_STOP_CHARS} characters, or a list of at most {MAX_STOP}",
            )
        self.stop = list(stop)
        ids = self.stop_token_ids if self.stop_token_ids is not None else []
        if (
            not isinstance(ids, list | tuple)
            or len(ids) > MAX_STOP
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in ids)
        ):
            raise _bad("stop_token_ids", self.stop_token_ids, f"a list of at most {MAX_STOP} token ids")
        self.stop_token_ids = list(ids)
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int)
            or isinstance(self.logprobs, bool)
            or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise _bad("logprobs", self.logprobs, f"an int in [0, {MAX_LOGPROBS}] or None")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, getattr(self, name), "a bool")
        self._validate_constraint()

    def _validate_constraint(self) -> None:
        """At most one constraint, each of the right type (its content is checked when it
        is compiled: a bad schema or regex fails its own request, not the batch)."""
        given = [k for k in CONSTRAINT_KINDS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"SamplingParams takes at most one constraint, got {', '.join(given)}")
        js = self.json_schema
        if js is not None:
            from .constraints.json_schema.loader import KINDS, is_schema_source  # (the one schema loader)

            if not is_schema_source(js):
                raise _bad("json_schema", js, KINDS)
        if self.regex is not None and not (
            isinstance(self.regex, str) and lone_surrogate(self.regex) is None
        ):
            raise _bad("regex", self.regex, "a str of valid text")
        if self.grammar is not None and not (
            isinstance(self.grammar, str) and self.grammar.strip() and lone_surrogate(self.grammar) is None
        ):
            raise _bad("grammar", self.grammar, "Lark grammar text, a file path or a packaged grammar name")
        if self.choice is not None:
            if (
                isinstance(self.choice, str)
                or not isinstance(self.choice, list | tuple)
                or not self.choice
                or not all(isinstance(c, str) and c and lone_surrogate(c) is None for c in self.choice)
            ):
                raise _bad("choice", self.choice, "a non-empty list of non-empty strings of valid text")
            self.choice = list(self.choice)
        from .constraints.json_schema.common import WHITESPACE  # (the compiler's own list)

        if self.whitespace not in WHITESPACE:
            raise _bad("whitespace", self.whitespace, " or ".join(repr(w) for w in WHITESPACE))
        if not isinstance(self.grammar_start, str) or not self.grammar_start:
            raise _bad("grammar_start", self.grammar_start, "a rule name")
        if self.grammar_syntax not in (None, "lark", "gbnf"):
            raise _bad("grammar_syntax", self.grammar_syntax, "'lark', 'gbnf' or None")
        if self.key_order not in ("schema", "any"):
            raise _bad("key_order", self.key_order, "'schema' or 'any'")
        if self.speculative is not None and not isinstance(self.speculative, bool):
            raise _bad("speculative", self.speculative, "a bool or None")
        for name in ("strict", "lenient"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, getattr(self, name), "a bool")
        self._validate_tags_and_reasoning()

    def _validate_tags_and_reasoning(self) -> None:
        """Types of the structural tag and reasoning fields (their content is checked when
        compiled, with errors naming the tag or trigger)."""
        tags = self.structural_tags
        if tags is not None:
            if not isinstance(tags, list | tuple) or not tags or not all(isinstance(t, dict) for t in tags):
                raise _bad("structural_tags", tags, "a non-empty list of tag dicts")
            self.structural_tags = list(tags)
        elif self.triggers is not None:
            raise ValueError("SamplingParams.triggers needs structural_tags")
        if self.triggers is not None:
            if not isinstance(self.triggers, list | tuple) or not all(
                isinstance(t, str) and t and lone_surrogate(t) is None for t in self.triggers
            ):
                raise _bad("triggers", self.triggers, "a list of non-empty strings")
            self.triggers = list(self.triggers)
        if (
            not isinstance(self.min_segments, int)
            or isinstance(self.min_segments, bool)
            or self.min_segments < 0
        ):
            raise _bad("min_segments", self.min_segments, "an int >= 0")
        mx = self.max_segments
        if mx is not None and (
            not isinstance(mx, int) or isinstance(mx, bool) or mx < max(1, self.min_segments)
        ):
            raise _bad("max_segments", mx, "None or an int >= max(1, min_segments)")
        r = self.reasoning
        if r is not None and not isinstance(r, bool):
            if (
                not isinstance(r, list | tuple)
                or len(r) != 2
                or not all(isinstance(x, str) and lone_surrogate(x) is None for x in r)
                or not r[1]
            ):
                raise _bad("reasoning", r, "True, or a (begin, end) pair of strings with a non-empty end")
            self.reasoning = (r[0], r[1])
        if r is False:
            self.reasoning = None
        b = self.max_reasoning_tokens
        if b is not None:
            if not isinstance(b, int) or isinstance(b, bool) or b < 0:
                raise _bad("max_reasoning_tokens", b, "an int >= 0 or None")
            if self.reasoning is None:
                raise ValueError("SamplingParams.max_reasoning_tokens needs reasoning")

    @property
    def constraint_kind(self) -> str | None:
        """ "json_schema", "regex", "grammar", "choice", "structural_tags", "reasoning"
        (reasoning then free text) or None."""
        for k in CONSTRAINT_KINDS:
            if getattr(self, k) is not None:
                return k
        return "reasoning" if self.reasoning is not None else None

    @property
    def grammar_dialect(self) -> str:
        """ "gbnf" or "lark": `grammar_syntax`, else GBNF for a name ending in ``.gbnf``."""
        if self.grammar_syntax is not None:
            return self.grammar_syntax
        g = self.grammar
        return "gbnf" if isinstance(g, str) and "\n" not in g and g.strip().endswith(".gbnf") else "lark"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _is_real(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)
