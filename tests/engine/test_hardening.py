"""One bad request fails alone, in bounded time, with an error that names what is wrong; the
rest of its batch finishes. Property tests go looking for the next failure."""

from __future__ import annotations

import math
import time

import pytest

from deepinfer import SamplingParams
from deepinfer.chat_template import ChatTemplate, ChatTemplateError
from deepinfer.sampling_params import MAX_STOP, MAX_STOP_CHARS, MAX_TEMPERATURE, MAX_TOP_K
from deepinfer.structured import judge

GOOD = SamplingParams(temperature=0, max_tokens=3)


def _good_finished(out) -> None:
    assert out.finish_reason in ("stop", "length") and out.error is None, out


# -- bad prompts and params fail alone ------------------------------------------------------------
BAD_PROMPTS = [
    ("lone surrogate", "abc\ud800def", "lone surrogate '\\ud800' at character 3"),
    ("empty ids", [], "the prompt is empty"),
    ("empty text", "", "the prompt is empty"),
    ("id out of range", [1, 10**6], "prompt token 1 is 1000000, not a token id"),
    ("id past int64", [1, 2**70], "prompt token 1 is"),
    ("negative id", [-1], "prompt token 0 is -1"),
    ("float id", [1.5], "prompt token 0 is 1.5"),
    ("bool id", [True], "prompt token 0 is True"),
    ("ids over the context", [1] * 300, "the prompt has 300 tokens, the model's context is 256"),
    ("text over the context", "hello " * 400, "the model's context is 256; no room to generate"),
    ("not a prompt", 3.5, "a prompt is text or a list of token ids, got float"),
    ("bytes", b"abc", "a prompt is text or a list of token ids, got bytes"),
]


@pytest.mark.parametrize("name,prompt,message", BAD_PROMPTS, ids=[b[0] for b in BAD_PROMPTS])
def test_bad_prompt_fails_alone(tiny_llm, name, prompt, message):
    outs = tiny_llm.generate(["Hi", prompt, "Bye"], GOOD, use_tqdm=False)
    assert [o.request_id for o in outs] == sorted(o.request_id for o in outs)
    _good_finished(outs[0])
    _good_finished(outs[2])
    assert outs[1].finish_reason == "error" and message in outs[1].error, outs[1].error
    assert not tiny_llm.has_unfinished_requests()


def test_prompt_length_at_the_context_and_past(tiny_llm):
    at, past = tiny_llm.generate([[1] * 255, [1] * 256], GOOD, use_tqdm=False)
    assert at.finish_reason == "length" and len(at.token_ids) == 1  # room for one token
    assert past.finish_reason == "error" and "no room to generate" in past.error


@pytest.mark.parametrize("where", ["mask_row", "accept"])
def test_a_matcher_that_raises_fails_its_request_alone(tiny_llm, where):
    p = SamplingParams(temperature=0, max_tokens=4, regex="[a-z ]{1,20}", speculative=False)
    bad = tiny_llm.add_request("Hi", p)
    good = tiny_llm.add_request("Hi", p)
    seq = tiny_llm._requests[bad]

    class Broken:  # the request's matcher, but `where` raises
        def __init__(self, m):
            self.m = m

        def __getattr__(self, name):
            if name == where:
                raise RuntimeError("matcher broke")
            return getattr(self.m, name)

    seq.constraint = Broken(seq.constraint)
    outs = {}
    while tiny_llm.has_unfinished_requests():
        outs.update((o.request_id, o) for o in tiny_llm.step())
    assert outs[bad].finish_reason == "error" and "matcher broke" in outs[bad].error
    assert outs[good].error is None and outs[good].parsed is not None


def test_bad_params_fail_alone(tiny_llm):
    outs = tiny_llm.generate(["Hi", "Bye"], [GOOD, {"temperature": 0}], use_tqdm=False)
    _good_finished(outs[0])
    assert outs[1].finish_reason == "error" and "params must be SamplingParams, got dict" in outs[1].error


def test_add_request_bad_prompt_comes_back_from_step(tiny_llm):
    rid = tiny_llm.add_request("x\udfff", GOOD)
    good = tiny_llm.add_request("Hi", GOOD)
    outs = {}
    while tiny_llm.has_unfinished_requests():
        outs.update((o.request_id, o) for o in tiny_llm.step())
    assert outs[rid].finish_reason == "error" and "lone surrogate" in outs[rid].error
    _good_finished(outs[good])


def test_a_huge_prompt_is_refused_before_tokenising(tiny_llm):
    text = "x" * (30 << 20)  # 30 MB
    t0 = time.perf_counter()
    out = tiny_llm.generate(text, GOOD, use_tqdm=False)[0]
    assert time.perf_counter() - t0 < 2.0
    assert out.finish_reason == "error" and "more than a context of 256 tokens can hold" in out.error


def test_the_prompt_character_bound_is_safe(tiny_llm):
    """At the bound nothing is refused early (it may still be too long once tokenised); the
    bound is never below what the context can hold."""
    tok = tiny_llm.tokenizer
    assert tok.max_prompt_chars >= tiny_llm.max_model_len * tok.longest_token_chars
    longest = max(tok.backend.get_vocab(), key=len)
    at = longest * (tok.max_prompt_chars // len(longest))
    out = tiny_llm.generate(at, GOOD, use_tqdm=False)[0]
    assert "characters" not in out.error and "no room to generate" in out.error
    past = tiny_llm.generate("x" * (tok.max_prompt_chars + 1), GOOD, use_tqdm=False)[0]
    assert "characters, more than a context" in past.error


def test_bad_constraints_fail_alone(tiny_llm):
    params = [
        GOOD,
        SamplingParams(max_tokens=3, regex="(unclosed"),
        SamplingParams(max_tokens=3, grammar='start: "a" undefined_rule'),
        SamplingParams(max_tokens=3, json_schema={"type": "object", "properties": {"a": {"type": "nope"}}}),
        GOOD,
    ]
    outs = tiny_llm.generate(["Hi"] * len(params), params, use_tqdm=False)
    _good_finished(outs[0])
    _good_finished(outs[4])
    assert all(o.finish_reason == "error" and o.error for o in outs[1:4])
    assert outs[1].error.startswith("regex:") and "position" in outs[1].error


def test_a_chat_conversation_the_template_refuses_fails_alone(tiny_llm):
    convs = [[{"role": "user", "content": "Hi"}], [{"content": "no role"}], "not a list of dicts"]
    outs = tiny_llm.chat(convs, GOOD, use_tqdm=False)
    _good_finished(outs[0])
    assert outs[1].finish_reason == "error" and "message 0 must be a dict with 'role'" in outs[1].error
    assert outs[2].finish_reason == "error" and "message" in outs[2].error


# -- SamplingParams: what the sampler cannot take is refused when made ---------------------------
@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature=MAX_TEMPERATURE * 2), "temperature"),
        (dict(temperature=-1e-300), "temperature"),
        (dict(top_k=MAX_TOP_K + 1), "top_k"),
        (dict(top_k=2**64), "top_k"),
        (dict(seed=2**63), "seed"),
        (dict(seed=-(2**63) - 1), "seed"),
        (dict(seed=1.5), "seed"),
        (dict(stop=["x"] * (MAX_STOP + 1)), "stop"),
        (dict(stop="x" * (MAX_STOP_CHARS + 1)), "stop"),
        (dict(stop="\ud800"), "stop"),
        (dict(stop_token_ids=[2**63]), "stop_token_ids"),
        (dict(regex="a\ud800"), "regex"),
        (dict(choice=["ok", "\udc00"]), "choice"),
        (dict(ignore_eos="yes"), "ignore_eos"),
        (dict(grammar_start=""), "grammar_start"),
    ],
)
def test_sampling_params_refuses_what_the_sampler_cannot_take(kw, match):
    with pytest.raises(ValueError, match=f"SamplingParams.{match} must be"):
        SamplingParams(**kw)


def test_sampling_params_bounds_are_inclusive():
    assert SamplingParams(temperature=MAX_TEMPERATURE).temperature == MAX_TEMPERATURE
    assert SamplingParams(top_k=MAX_TOP_K).top_k == MAX_TOP_K
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1 and SamplingParams(seed=-(2**63)).seed == -(2**63)
    assert len(SamplingParams(stop=["x"] * MAX_STOP).stop) == MAX_STOP
    SamplingParams(stop="x" * MAX_STOP_CHARS)
    # below the smallest temperature the sampler can divide by: greedy
    assert SamplingParams(temperature=5e-324).temperature == 0.0
    assert SamplingParams(temperature=1e-5).temperature == 1e-5


def test_extreme_sampling_values_run(tiny_llm):
    params = [
        SamplingParams(temperature=MAX_TEMPERATURE, max_tokens=3, seed=2**63 - 1),
        SamplingParams(temperature=1e-5, top_k=MAX_TOP_K, max_tokens=3, seed=-(2**63)),
        SamplingParams(temperature=1.0, top_p=1e-300, min_p=1.0, max_tokens=3),
        GOOD,
    ]
    outs = tiny_llm.generate(["Hi"] * 4, params, use_tqdm=False)
    for o in outs:
        _good_finished(o)


# -- judging: never raises, linear for regexes -----------------------------------------------
def test_judge_never_raises():
    p = SamplingParams(json_schema={"type": "string", "maxLength": "3"})
    parsed, error = judge(p, '"abcdef"', "stop")
    assert parsed is None and error
    deep = "[" * 100_000 + "]" * 100_000
    parsed, error = judge(SamplingParams(json_schema={"type": "array"}), deep, "stop")
    assert parsed is None and "nested too deeply" in error


def test_regex_judge_is_linear(tiny_llm):
    p = SamplingParams(regex=r"(a|aa)+b")  # re.fullmatch backtracks exponentially on a...a
    compiled = tiny_llm.compile_constraint(p)
    t0 = time.perf_counter()
    assert judge(p, "a" * 5000, "stop", compiled)[1] == "output does not match the regex"
    assert judge(p, "a" * 5000 + "b", "stop", compiled) == ("a" * 5000 + "b", None)
    assert time.perf_counter() - t0 < 2.0


# -- chat templates: bounded in time and size ----------------------------------------------------
MSG = [{"role": "user", "content": "hi"}]
HOSTILE_TEMPLATES = [
    (
        "nested loops",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "took",
    ),
    ("repeat", "{{ 'a' * 10**10 }}", "size bound"),
    ("power", "{{ 2 ** 1000000000 }}", "size bound"),
    ("str method", "{{ 'a'.ljust(10**10) }}", "size bound"),
    ("filter", "{{ 'a' | center(10**10) }}", "size bound"),
    (
        "doubling",
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "size bound",
    ),
    (
        "list doubling",
        "{% set ns = namespace(s=[1]) %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "size bound",
    ),
    ("output", "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "characters"),
    ("recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed"),
    ("raise", "{{ raise_exception('no system role') }}", "no system role"),
    ("syntax", "{% for %}", r"does not compile \(line 1\)"),
    ("undefined call", "line\n{{ nothing() }}", "line 2"),
    ("escape", "{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed"),
]


@pytest.mark.parametrize("name,source,match", HOSTILE_TEMPLATES, ids=[h[0] for h in HOSTILE_TEMPLATES])
def test_hostile_chat_templates_fail_fast(name, source, match):
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError, match=match):
        ChatTemplate(source, max_seconds=0.5, max_chars=1 << 20).render(MSG)
    assert time.perf_counter() - t0 < 3.0


def test_chat_template_size_bound_at_and_past():
    t = ChatTemplate("{{ 'x' * n }}", max_chars=1000)
    assert t.render(MSG, n=1000) == "x" * 1000
    with pytest.raises(ChatTemplateError, match="size bound"):
        t.render(MSG, n=1001)
    out = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", max_chars=4)
    assert out.render([{"role": "u", "content": "abcd"}]) == "abcd"
    with pytest.raises(ChatTemplateError, match="passed 4 characters"):
        out.render([{"role": "u", "content": "abc"}, {"role": "u", "content": "de"}])


def test_chat_template_time_bound_at_and_past():
    loop = "{% for i in range(n) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
    ChatTemplate(loop, max_seconds=5.0).render(MSG, n=10)
    with pytest.raises(ChatTemplateError, match="longer than 0.2 s"):
        ChatTemplate(loop, max_seconds=0.2).render(MSG, n=100000)


def test_the_model_template_renders_as_before(tiny_llm):
    text = tiny_llm.tokenizer.apply_chat_template(MSG)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


# -- property tests: random values find the next failure -------------------------------------
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([5e-324, 1e-45, 1e-5, 0.7, 1.0, 2**31, 2**63, 2**64]),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-5, max_value=2**64), max_size=3),
    st.lists(st.text(max_size=4), max_size=3),
)
_fields = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "max_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
]


@hypothesis.settings(max_examples=40)
@hypothesis.given(kw=st.dictionaries(st.sampled_from(_fields), _values, max_size=4))
def test_random_sampling_params_fail_alone(tiny_llm, kw):
    try:
        p = SamplingParams(**kw)
    except ValueError as e:
        assert str(e).startswith("SamplingParams.")
        return
    p.max_tokens = min(p.max_tokens or 4, 4)  # bounded run
    outs = tiny_llm.generate(["Hi", "Bye"], [p, GOOD], use_tqdm=False)
    assert outs[0].finish_reason in ("stop", "length", "error")
    _good_finished(outs[1])


_prompt_items = st.one_of(
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)


@hypothesis.settings(max_examples=40)
@hypothesis.given(
    prompt=st.one_of(st.text(max_size=40), st.lists(_prompt_items, max_size=6), st.binary(max_size=8))
)
def test_random_prompts_fail_alone(tiny_llm, prompt):
    outs = tiny_llm.generate([prompt, "Hi"], [GOOD, GOOD], use_tqdm=False)
    assert outs[0].finish_reason in ("stop", "length") or (outs[0].finish_reason == "error" and outs[0].error)
    _good_finished(outs[1])
