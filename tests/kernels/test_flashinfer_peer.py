"""benchmarks/flashinfer_peer.py's extraction of FlashInfer's sampling headers from its wheel
(the peer's build needs a CUDA machine; what it is built from is decided here): the headers
sampling.cuh includes, directly or not, and the vendored CCCL, nothing else of the wheel."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location(
        "flashinfer_peer", ROOT / "benchmarks" / "flashinfer_peer.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


HEADERS = {
    "flashinfer/sampling.cuh": b'#include <cub/cub.cuh>\n#include "utils.cuh"\n#include "math.cuh"\n',
    "flashinfer/utils.cuh": b'#include <cuda.h>\n#include "exception.h"\n',
    "flashinfer/math.cuh": b'#include "utils.cuh"\n',  # (included twice: copied once)
    "flashinfer/exception.h": b"#include <stdexcept>\n",
    "flashinfer/attention/prefill.cuh": b'#include "../utils.cuh"\n',  # not reached from sampling.cuh
}


def test_header_closure_follows_quoted_and_relative_includes(peer):
    got = peer.header_closure(HEADERS.__getitem__, HEADERS.__contains__)
    assert got == [
        "flashinfer/exception.h",
        "flashinfer/math.cuh",
        "flashinfer/sampling.cuh",
        "flashinfer/utils.cuh",
    ]
    # a relative include from a subfolder resolves against that folder
    assert peer.header_closure(
        HEADERS.__getitem__, HEADERS.__contains__, "flashinfer/attention/prefill.cuh"
    ) == [
        "flashinfer/attention/prefill.cuh",
        "flashinfer/exception.h",
        "flashinfer/utils.cuh",
    ]


def test_extract_writes_the_closure_and_cccl_only(peer, tmp_path):
    wheel = tmp_path / "flashinfer_python-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in HEADERS.items():
            z.writestr("flashinfer/data/include/" + name, text)
        z.writestr("flashinfer/data/cccl/cub/cub/cub.cuh", b"// cub\n")
        z.writestr("flashinfer/data/csrc/sampling.cu", b"// not needed\n")
    dest = tmp_path / "out"
    (dest / "stale").mkdir(parents=True)  # an earlier extraction's leftovers go
    headers = peer.extract(str(wheel), str(dest))
    assert "flashinfer/attention/prefill.cuh" not in headers and len(headers) == 4
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == sorted([f"include/{h}" for h in headers] + ["cccl/cub/cub/cub.cuh"])
    assert (dest / "include/flashinfer/utils.cuh").read_bytes() == HEADERS["flashinfer/utils.cuh"]


def test_extract_refuses_a_wheel_without_the_sources(peer, tmp_path):
    wheel = tmp_path / "other.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("other/__init__.py", b"")
    with pytest.raises(SystemExit, match="no flashinfer/data/include/flashinfer/sampling.cuh"):
        peer.extract(str(wheel), str(tmp_path / "out"))


def test_load_names_the_missing_headers(peer, tmp_path):
    with pytest.raises(SystemExit, match="no FlashInfer headers under .*--extract WHEEL"):
        peer.load(str(tmp_path))
