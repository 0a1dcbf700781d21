"""The embedded SmolLM2-135M-Instruct GGUF against transformers' own GGUF loading (float32).

transformers dequantizes the same file independently (its own reader, permutation and
tokenizer conversion), so equal logits check our reader, dequantization, Q/K un-permutation,
config and forward at once. Loaded once for the module (~20 s: transformers' GGUF path is slow).
"""

from __future__ import annotations

import os

import pytest
import torch

from deepinfer import LLM, SamplingParams

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello, world!",
    "Ünïcødé: 日本語のテキスト, emoji 🙂🚀, Ελληνικά, עברית",
    '{"name": "Ada", "tags": ["x", "y"], "n": -12.5e3, "ok": true, "nil": null}',
    "   leading spaces\tand\ttabs\n\n\nthree newlines      six spaces ",
    "digits 0123456789 1234567 3.14159 -42 1e-9 2024-11-29",
    "<|im_start|>user\nhi<|im_end|>\n",
    "x" * 40 + "  \r\n end",
]


@pytest.fixture(scope="module")
def ours(embedded_gguf_path):
    return LLM(None, dtype="float32", device="cpu", seed=0)


@pytest.fixture(scope="module")
def hf(embedded_gguf_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    pytest.importorskip("accelerate")  # transformers needs it for GGUF files
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(embedded_gguf_path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return tok, model


def test_facts(ours):
    tok = ours.tokenizer
    assert tok.vocab_size == 49152 == ours.config.vocab_size
    assert tok.special_token_ids == frozenset(range(17))
    assert tok.eos_token_ids == (2,) and tok.id_to_token(2) == "<|im_end|>"
    assert ours.config.tie_word_embeddings and ours.config.num_kv_heads == 3


def test_tokenizer_ids_equal_transformers_and_round_trip(ours, hf):
    hf_tok, _ = hf
    for text in TEXTS:
        ids = ours.tokenizer.encode(text)
        assert ids == hf_tok(text)["input_ids"], text
        assert ours.tokenizer.decode(ids, skip_special_tokens=False) == text


def test_token_bytes_facts(ours):
    pytest.importorskip("deepinfer.constraints.vocab")
    tb = ours.tokenizer.token_bytes()
    assert len(tb) == 49152 and all(tb[i] is None for i in range(17))
    assert sum(1 for b in tb if b is not None and not _utf8(b)) == 313
    single = {b[0] for b in tb if b is not None and len(b) == 1}
    assert 256 - len(single) == 21
    vocab = ours.tokenizer.vocabulary()
    assert vocab.eos_ids == (2,) and len(vocab) == 49152
    assert tb[ours.tokenizer.encode("hello")[0]] == b"hello"


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_logits_and_greedy_text_equal_transformers(ours, hf):
    _, model = hf
    msgs = [{"role": "user", "content": "Write a haiku about JSON."}]
    prompt = ours.tokenizer.apply_chat_template(msgs)
    ids = ours.tokenizer.encode(prompt)
    # logits at every position, through the engine's model (fresh cache)
    got = ours.model.logits([ids])[0][None]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits
    assert (got - ref).abs().max().item() < 1e-3
    # greedy text through the whole engine vs transformers' generate
    n = 24
    with torch.no_grad():
        x = torch.tensor([ids])  # explicit mask: the prompt holds pad id 2 (<|im_end|>)
        ref_ids = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=2,
        )[0, len(ids) :].tolist()
    out = ours.chat(msgs, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)[0]
    assert out.token_ids == ref_ids
    assert out.text == ours.tokenizer.decode(ref_ids)


def test_batched_greedy_equals_one_by_one(ours):
    prompts = [
        "The capital of France is",
        "def add(a, b):",
        "1, 1, 2, 3, 5, 8,",
        "Q: Why is the sky blue?\nA:",
    ]
    sp = SamplingParams(temperature=0, max_tokens=16)
    batched = ours.generate(prompts, sp, use_tqdm=False)
    for p, b in zip(prompts, batched):
        assert ours.generate(p, sp, use_tqdm=False)[0].token_ids == b.token_ids


def test_chat_answers(ours):
    out = ours.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=32),
        use_tqdm=False,
    )[0]
    assert "Paris" in out.text and out.finish_reason == "stop"
