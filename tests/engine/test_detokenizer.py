"""IncrementalDetokenizer against a full decode: every released text is a prefix of the final
text, and once all tokens are in, the texts agree (random token ids, and text with characters
split across byte-level tokens)."""

from __future__ import annotations

import random

import pytest

from deepinfer import SamplingParams
from deepinfer.detokenizer import IncrementalDetokenizer


def _check(tok, ids, hold=0):
    d = IncrementalDetokenizer(tok, hold=hold)
    seen = ""
    for n in range(1, len(ids) + 1):
        t = d.text(ids[:n])
        assert t.startswith(seen), (ids[:n], seen, t)
        seen = t
    final = d.reference_text(ids)
    assert final.startswith(seen)
    if not hold and not final.endswith("\ufffd"):
        assert seen == final
    return seen


@pytest.mark.parametrize("seed", range(4))
def test_random_ids_release_prefixes_of_the_full_decode(tiny_llm, seed):
    tok = tiny_llm.tokenizer
    rng = random.Random(seed)
    ids = [rng.randrange(tok.vocab_size) for _ in range(60)]
    _check(tok, ids)


@pytest.mark.parametrize(
    "text", ["héllo wörld — ok", "日本語のテキストです", "emoji 🎉🎉 and ✓ marks", "a\n\tb  c"]
)
def test_split_characters_wait_for_their_last_byte(tiny_llm, text):
    tok = tiny_llm.tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    assert _check(tok, ids) == text
    d = IncrementalDetokenizer(tok)
    for n in range(1, len(ids) + 1):
        assert "\ufffd" not in d.text(ids[:n])


def test_hold_keeps_back_a_possible_stop_string(tiny_llm):
    tok = tiny_llm.tokenizer
    ids = tok.encode("one two three four", add_special_tokens=False)
    assert _check(tok, ids, hold=3) == "one two three four"[:-3]


def test_streamed_text_with_a_stop_string_never_shows_what_is_cut(tiny_llm):
    """Streamed partials are prefixes of the final text even when a stop string cuts it."""
    prompt = [1, 5, 9]
    free = tiny_llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
                             use_tqdm=False)[0].text  # fmt: skip
    stop = free[len(free) // 2 : len(free) // 2 + 3]
    if len(stop) < 3 or not stop.strip():
        pytest.skip("the greedy text has no usable stop string")
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[stop])
    tiny_llm.add_request(prompt, params, stream=True)
    texts = []
    while tiny_llm.has_unfinished_requests():
        texts += [o.text for o in tiny_llm.step()]
    final = texts[-1]
    assert stop not in final
    for a, b in zip(texts, texts[1:]):
        assert b.startswith(a)
