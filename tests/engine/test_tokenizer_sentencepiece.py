"""SentencePiece GGUF files (``tokenizer.ggml.model = "llama"``: Llama 2, Mistral v1-v3, Phi-3,
Gemma) load: pieces, scores, token types and byte pieces become a tokenizer that encodes like
the ``sentencepiece`` library, and a vocabulary with each token's exact bytes.

The GGUF is written here the way llama.cpp's converter writes one (pieces, scores and types read
from mistral-common's ``mistral_instruct_tokenizer_240323.model.v3``, Apache-2.0: 32,768 pieces,
750 of them control tokens, 256 byte pieces) around a tiny random-weight Llama. Where
``$DEEPINFER_SHARED_DATA/llama.cpp-vocab`` holds llama.cpp's vocab-only GGUFs and their test
vectors (``ggml-vocab-llama-spm.gguf.inp/.out``), those are checked too.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from deepinfer.loader import load_model
from deepinfer.loader.gguf import build_tokenizer
from deepinfer.loader.gguf_file import GGUFError, GGUFFile
from deepinfer.tokenizer import Tokenizer
from tests.constraints.shared_data import need_shared
from tests.constraints.vocabs import force, mistral_common_file, sentencepiece_bytes

sentencepiece = pytest.importorskip("sentencepiece", reason="the sentencepiece library is the test oracle")
gguf = pytest.importorskip("gguf")

H, NH, NKV, HD, FF = 8, 2, 1, 4, 16


def piece_types(sp) -> list[int]:
    """llama.cpp's token types: 1 normal, 2 unknown, 3 control, 5 unused, 6 byte."""
    kind = [(sp.is_byte, 6), (sp.is_control, 3), (sp.is_unknown, 2), (sp.is_unused, 5)]
    return [next((t for f, t in kind if f(i)), 1) for i in range(sp.get_piece_size())]


def write_spm_gguf(path, sp) -> str:
    n = sp.get_piece_size()
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in [("block_count", 1), ("context_length", 64), ("embedding_length", H)]:
        w.add_uint32(f"llama.{k}", v)
    for k, v in [("feed_forward_length", FF), ("attention.head_count", NH), ("attention.head_count_kv", NKV)]:
        w.add_uint32(f"llama.{k}", v)
    w.add_uint32("llama.vocab_size", n)
    w.add_uint32("llama.rope.dimension_count", HD)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types(piece_types(sp))
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    g = np.random.default_rng(0)

    def rnd(*shape):
        return (g.standard_normal(shape) * 0.2).astype(np.float32)

    for name, arr in {
        "token_embd.weight": rnd(n, H),
        "output_norm.weight": 1 + rnd(H),
        "output.weight": rnd(n, H),
        "blk.0.attn_norm.weight": 1 + rnd(H),
        "blk.0.attn_q.weight": rnd(NH * HD, H),
        "blk.0.attn_k.weight": rnd(NKV * HD, H),
        "blk.0.attn_v.weight": rnd(NKV * HD, H),
        "blk.0.attn_output.weight": rnd(H, NH * HD),
        "blk.0.ffn_norm.weight": 1 + rnd(H),
        "blk.0.ffn_gate.weight": rnd(FF, H),
        "blk.0.ffn_up.weight": rnd(FF, H),
        "blk.0.ffn_down.weight": rnd(H, FF),
    }.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """(sentencepiece processor, GGUF path, our Tokenizer loaded from it)."""
    sp = sentencepiece.SentencePieceProcessor(
        model_file=mistral_common_file("mistral_instruct_tokenizer_240323.model.v3")
    )
    path = write_spm_gguf(tmp_path_factory.mktemp("spm") / "tiny-spm.gguf", sp)
    return sp, path, Tokenizer.from_loaded(load_model(path))


TEXTS = [
    "Hello world",
    " Hello world",
    "  two  spaces ",
    "\n\n\tTabs\r\n",
    "é 日本語 😀 🦙 ½",
    '{"a": [1, 2.5e-3, null], "b": "x\\n"}',
    "нещо на Български ქართული",
    "",
    " ",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encodes_and_decodes_like_sentencepiece(env, text):
    sp, _, tok = env
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == sp.encode(text)
    assert tok.encode(text) == [sp.bos_id(), *ids]  # tokenizer.ggml.add_bos_token
    assert tok.decode(ids) == sp.decode(ids) == text


def test_gguf_vocabulary_has_each_tokens_exact_bytes(env):
    sp, _, tok = env
    vocab = tok.vocabulary()
    assert list(vocab.token_bytes) == sentencepiece_bytes(sp)
    control = [i for i in range(sp.get_piece_size()) if sp.is_control(i)]
    assert len(control) == 750 and tok.special_token_ids >= set(control)
    assert vocab.eos_ids == (sp.eos_id(),) and tok.bos_token_id == sp.bos_id()
    # control-token text is its token, as in llama.cpp; it is never constrained text
    assert tok.encode("[INST] hi [/INST]", add_special_tokens=False)[::4] == [3, 4]


def test_constrained_generation_on_a_sentencepiece_model(env):
    from deepinfer import LLM, SamplingParams
    from deepinfer.constraints import Compiler

    _, path, _ = env
    llm = LLM(path, dtype="float32", device="cpu", seed=0)
    schema = {
        "type": "object",
        "properties": {"k": {"type": "string", "maxLength": 6}},
        "required": ["k"],
        "additionalProperties": False,
    }
    params = SamplingParams(json_schema=schema, whitespace="compact", max_tokens=64, temperature=1.0)
    for out in llm.generate(["a", "b", "c"], params):
        assert out.finish_reason == "stop", out.text
        value = json.loads(out.text)
        assert list(value) == ["k"] and len(value["k"]) <= 6
    vocab = llm.tokenizer.vocabulary()
    force(Compiler(vocab).json_schema(schema), vocab.encode('{"k":"é 😀"}'))


BAD = [
    ("tokenizer.ggml.scores", None, "tokenizer.ggml.scores"),
    ("tokenizer.ggml.scores", np.zeros(3, dtype=np.float32), "one per token"),
    ("tokenizer.ggml.scores", np.full(4, np.nan, dtype=np.float32), "finite"),
    ("tokenizer.ggml.token_type", np.array([1, 1, 9, 1], dtype=np.int32), r"token types in \[1, 6\]"),
    ("tokenizer.ggml.add_space_prefix", 1, "a bool"),
    ("tokenizer.ggml.unknown_token_id", 7, r"a token id in \[0, 4\)"),
]


@pytest.mark.parametrize("key, value, match", BAD, ids=[f"{k}={v!r}"[:50] for k, v, _ in BAD])
def test_bad_sentencepiece_metadata_names_the_key(key, value, match):
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "▁a", "a", "▁"],
        "tokenizer.ggml.scores": np.array([0, -1, -2, -3], dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([2, 1, 1, 1], dtype=np.int32),
    }
    meta[key] = value
    with pytest.raises(GGUFError, match=match) as e:
        build_tokenizer({k: v for k, v in meta.items() if v is not None}, "x.gguf")
    assert key in str(e.value)


@pytest.mark.parametrize("name", ["ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"])
def test_llama_cpp_vocab_files_match_their_test_vectors(name):
    path = need_shared("llama.cpp-vocab", name)
    f = GGUFFile(str(path))
    tok, _ = build_tokenizer(f.metadata, str(path))
    f.close()
    texts = path.with_name(name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    expected = path.with_name(name + ".out").read_text(encoding="utf-8").split("\n")
    for text, ids in zip(texts, expected, strict=False):
        assert tok.encode(text, add_special_tokens=False).ids == [int(x) for x in ids.split()], repr(text)


def test_without_the_space_prefix_like_gemma(env):
    """``tokenizer.ggml.add_space_prefix = false`` (Gemma): no ``▁`` before the text, none dropped."""
    from sentencepiece import sentencepiece_model_pb2

    sp, path, _ = env
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(sp.serialized_model_proto())
    proto.normalizer_spec.add_dummy_prefix = False
    plain = sentencepiece.SentencePieceProcessor(model_proto=proto.SerializeToString())
    f = GGUFFile(path)
    meta = {**f.metadata, "tokenizer.ggml.add_space_prefix": False}
    f.close()
    tok, _ = build_tokenizer(meta, path)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == plain.encode(text), repr(text)
        assert tok.decode(ids) == text
