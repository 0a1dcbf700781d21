"""GBNF grammars and ``key_order="any"`` end to end on the embedded SmolLM2-135M-Instruct.

- A GBNF file of ``deepinfer.grammars`` (``person.gbnf``) picked by its suffix: greedy and
  sampled outputs finish, and each is judged independently of the engine, by xgrammar's
  GBNF matcher and by json.loads.
- ``key_order="any"``: the engine's own compiled constraint (over the model's vocabulary)
  takes teacher-forced instances whose keys are out of schema order, token by token as the
  tokenizer splits them, and refuses a key given twice and an object closed without a
  required key; a generated output validates under the schema.
- A bad GBNF grammar is refused at its line and column, naming the construct.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from deepinfer import LLM, SamplingParams, grammars
from deepinfer.constraints import Matcher

pytestmark = pytest.mark.slow

PEOPLE = [
    "Maria Lopez is 34 and lives in Madrid.",
    "Kenji Sato is a 28-year-old engineer from Osaka.",
    "Claire Dubois (45) runs a bakery in Lyon.",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def llm(embedded_gguf_path):
    return LLM(seed=0, dtype="float32", device="cpu")


def test_gbnf_file_generates_valid_output(llm):
    xgr = pytest.importorskip("xgrammar")
    text = grammars.load("person.gbnf")
    xg = xgr.Grammar.from_ebnf(text)
    params = [
        SamplingParams(grammar="person.gbnf", max_tokens=48, **s)
        for s in ({"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.95, "seed": 7})
    ]
    convs = [chat(f"Return the person as JSON with name, age and city: {p}") for p in PEOPLE[:2]]
    outs = llm.chat([c for c in convs for _ in params], [p for _ in convs for p in params], use_tqdm=False)
    for o in outs:
        assert o.finish_reason == "stop" and o.error is None, o
        assert xgr.testing._is_grammar_accept_string(xg, o.text), o.text
        obj = json.loads(o.text)
        assert 0 <= obj["age"] <= 119 and obj["name"][:1].isupper(), o.text


def _forced(matcher, tokenizer, text: str) -> bool:
    """Teacher-force ``text`` (the tokenizer's tokens) and EOS; False at the first refusal."""
    for t in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.accept(t):
            return False
    return matcher.can_end() and matcher.accept(tokenizer.eos_token_id)


def test_key_order_any_teacher_forced(llm):
    compiled = llm.compile_constraint(SamplingParams(json_schema=SCHEMA, key_order="any"))
    in_order = llm.compile_constraint(SamplingParams(json_schema=SCHEMA))
    tok = llm.tokenizer
    good = [
        '{"age": 34, "name": "Maria Lopez"}',
        '{"city": "Madrid", "age": 34, "name": "Maria"}',
        '{\n  "name": "Kenji",\n  "city": "Osaka",\n  "age": 28\n}',
    ]
    for text in good:
        assert jsonschema.Draft202012Validator(SCHEMA).is_valid(json.loads(text))
        assert _forced(Matcher(compiled), tok, text), text
    assert not _forced(Matcher(in_order), tok, good[0])  # schema order stays the default
    bad = [
        '{"age": 34, "name": "Maria", "age": 35}',  # a key given twice
        '{"city": "Lyon", "age": 45}',  # a required key missing
        '{"age": 34, "name": "Maria", "job": "baker"}',  # an undeclared key
    ]
    for text in bad:
        assert not _forced(Matcher(compiled), tok, text), text


def test_key_order_any_generates_valid_json(llm):
    params = SamplingParams(json_schema=SCHEMA, key_order="any", temperature=0, max_tokens=48)
    outs = llm.chat([chat(f"Return JSON with the person's name, age and city: {p}") for p in PEOPLE], params)
    for o in outs:
        assert o.finish_reason == "stop" and o.valid, o
        jsonschema.validate(json.loads(o.text), SCHEMA)


def test_gbnf_errors_name_line_and_column(llm):
    from deepinfer.constraints import ConstraintError

    bad = 'root ::= "{" item "}"\nitem ::= [a-z]+ <[128000]>\n'
    with pytest.raises(ConstraintError) as info:
        llm.compile_constraint(SamplingParams(grammar=bad, grammar_syntax="gbnf"))
    assert "token reference '<[128000]>' is not supported" in str(info.value)
    assert (info.value.line, info.value.column) == (2, 17)
    with pytest.raises(ConstraintError, match=r"rule 'value' is used but not defined \(line 1, column 14\)"):
        llm.compile_constraint(SamplingParams(grammar='root ::= "[" value "]"', grammar_syntax="gbnf"))
