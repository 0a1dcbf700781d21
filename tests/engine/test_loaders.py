"""Loading: tiny HF folders offline, and clear errors for bad paths and broken files."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.loader import load_model
from deepinfer.loader.gguf_file import GGUFError, GGUFFile

from .conftest import tiny_hf_model, write_hf_folder


def test_tiny_hf_folder_loads_offline_and_matches(tiny_folder, tiny_llm):
    folder, hf = tiny_folder
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    assert tiny_llm.config.num_layers == 2 and tiny_llm.tokenizer.eos_token_ids == (2,)
    ids = [1, 5, 900, 77]
    out = tiny_llm.generate(
        [ids], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False
    )
    with torch.no_grad():
        assert out[0].token_ids == [int(hf(torch.tensor([ids])).logits[0, -1].argmax())]


@pytest.mark.parametrize("variant", ["llama3-rope-tied", "qwen2-bias"])
def test_hf_variants_load(tmp_path, smollm_tokenizer, monkeypatch_session, variant):
    model, d = tiny_hf_model(variant)
    folder = write_hf_folder(tmp_path / variant, model, d, smollm_tokenizer)
    lm = load_model(folder)
    assert lm.config.architecture == d["model_type"]
    assert lm.config.tie_word_embeddings == d["tie_word_embeddings"]
    assert lm.config.attention_bias == (variant == "qwen2-bias")


def test_hub_repo_offline_gives_clear_error(monkeypatch_session):
    with pytest.raises(FileNotFoundError, match="not a local folder or .gguf file"):
        load_model("nobody-here/no-such-model-xyz")


@pytest.mark.parametrize("path", ["/no/such/folder", "./missing-model", "/tmp/nope/model.gguf"])
def test_unknown_path(path):
    with pytest.raises(FileNotFoundError, match="not found|does not exist"):
        load_model(path)


def test_missing_tokenizer(tmp_path, smollm_tokenizer):
    model, d = tiny_hf_model("llama-gqa-untied")
    folder = write_hf_folder(tmp_path / "m", model, d, smollm_tokenizer, tokenizer=False)
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_model(folder)


def test_pickle_only_checkpoint_is_refused(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"model_type": "llama", "vocab_size": 8, "hidden_size": 8, '
        '"intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1}'
    )
    (folder / "tokenizer.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04 not loaded")
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors weights"):
        load_model(str(folder))
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="not a readable tokenizer.json"):
        load_model(str(folder))


def test_unsupported_architecture(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        load_model(str(folder))


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "empty"),
        (b"NOPE" + b"\0" * 64, "not a GGUF file"),
        (b"GGUF\x09\0\0\0" + b"\0" * 16, "unsupported GGUF version"),
    ],
)
def test_corrupt_gguf(tmp_path, content, match):
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    with pytest.raises(GGUFError, match=match):
        load_model(str(p))


@pytest.mark.parametrize("keep", [100, 2_000_000, 50_000_000])
def test_truncated_gguf(tmp_path, embedded_gguf_path, keep):
    p = tmp_path / "cut.gguf"
    with open(embedded_gguf_path, "rb") as src, open(p, "wb") as dst:
        dst.write(src.read(keep))
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(p)


def test_gguf_without_tokenizer(tmp_path):
    import gguf
    import numpy as np

    p = tmp_path / "notok.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    for k, v in [
        ("block_count", 1),
        ("embedding_length", 8),
        ("feed_forward_length", 8),
        ("attention.head_count", 2),
        ("context_length", 32),
    ]:
        w.add_uint32(f"llama.{k}", v)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="no tokenizer"):
        load_model(str(p))


def test_default_model_path(embedded_gguf_path):
    assert embedded_gguf_path.endswith(".gguf") and os.path.isfile(embedded_gguf_path)
    assert shutil.disk_usage(os.path.dirname(embedded_gguf_path))


def test_bad_llm_arguments(tiny_folder):
    with pytest.raises(ValueError, match="dtype must be"):
        LLM(tiny_folder[0], dtype="float8")
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLM(tiny_folder[0], max_num_seqs=0)


def test_exported_tokenizer_is_the_gguf_s(tmp_path, embedded_gguf_path, smollm_tokenizer):
    """Where the GGUF is absent (the device machine), the tests' tiny models take the SmolLM2
    tokenizer from ``bench_e2e.py --export-tokenizer``'s copy: it encodes, decodes and states
    its special facts as the GGUF's does."""
    import sys

    from .conftest import exported_tokenizer

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import bench_e2e

    assert exported_tokenizer(str(tmp_path)) is None
    bench_e2e.export_tokenizer(str(tmp_path))
    tok, special = exported_tokenizer(str(tmp_path))
    gguf_tok, gguf_special = smollm_tokenizer
    assert special == gguf_special and special["chat_template"]
    for text in ['<|im_start|>user\nHello, wörld! {"a": [1, 2]}<|im_end|>\n', "  tabs\tand\nnewlines 🙂"]:
        ids = gguf_tok.encode(text).ids
        assert tok.encode(text).ids == ids
        assert tok.decode(ids, skip_special_tokens=False) == gguf_tok.decode(ids, skip_special_tokens=False)
    assert tok.get_vocab_size() == gguf_tok.get_vocab_size()
