"""SamplingParams: how one request is decoded. Validates itself on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ._text import clip_repr, lone_surrogate

CONSTRAINT_KINDS = ("json_schema", "regex", "grammar", "choice")

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
        (`deepinfer.grammars.available()`: "json", "sql", "arithmetic", "csv", ...).
    choice : list of str
        The output is exactly one of these strings.
    whitespace : "flexible" (default), "natural" or "compact"
        JSON Schema only: bounded whitespace in every gap between JSON tokens (at most one line
        break, then up to 20 spaces or tabs); the spaces and line breaks of spaced or
        pretty-printed JSON only (one space or one line break + indent after ``{ [ ,`` and
        before ``} ]``, one space after ``:``); or none. "flexible" is the default because it
        measured best on extraction: the model lays JSON out as it would unasked, and its
        answers stay at or above free text (docs/structured-generation.md, "Whitespace").
    strict : bool
        JSON Schema only: forbid properties the schema does not declare.
    lenient : bool
        JSON Schema only: relax keywords the grammar cannot enforce (listed in
        `RequestOutput.relaxed`) instead of refusing the schema; the output is still
        validated with jsonschema.
    grammar_start : str
        The start rule of `grammar`.
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
        if self.speculative is not None and not isinstance(self.speculative, bool):
            raise _bad("speculative", self.speculative, "a bool or None")
        for name in ("strict", "lenient"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, getattr(self, name), "a bool")

    @property
    def constraint_kind(self) -> str | None:
        """ "json_schema", "regex", "grammar", "choice" or None."""
        for k in CONSTRAINT_KINDS:
            if getattr(self, k) is not None:
                return k
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _is_real(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)
