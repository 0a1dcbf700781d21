"""The kernels' ahead-of-time build (constraints/native.py): a build of three kernels, loaded in
a new process, gives the pure-Python references' results on random inputs, called directly
or bound to their tables; arguments of a type it was not built for (bound or not), a corrupt
build and a stale one all fall back to numba's JIT, with the same results. The arguments'
codes (constraints/arg_codes.c), by which calls find their signature, name one type each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from deepinfer.constraints import native

ROOT = Path(__file__).resolve().parents[2]
ONLY = [  # (a trie's construction runs _subtree_sets)
    "deepinfer.constraints.tokens.rows.count_bytes",
    "deepinfer.constraints.tokens.trie._walk",
    "deepinfer.constraints.tokens.trie._subtree_sets",
]

BUILD = """
import numpy as np
from deepinfer.constraints import native
from deepinfer.constraints.native_build import workload_vocab
from deepinfer.constraints.tokens import rows

def run():  # meets the three kernels with the types the compiler passes
    workload_vocab().index()  # (the trie's construction, and its walk's warm-up)
    rows.count_bytes(np.full((2, 3), -1, dtype=np.int32), np.ones(3, dtype=np.int64), 0)

from deepinfer.constraints import arg_codes

arg_codes.build({folder!r})  # (the calls' argument codes, beside the kernels)
print(native.build(run, {folder!r}, only={only!r}))
"""

# random automata and tries: the AOT kernels against their pure-Python references
CHECK = """
import json, sys
import numpy as np
from deepinfer.constraints import native
from deepinfer.constraints.tokens import rows, trie
from deepinfer.constraints.tokens.trie import VocabIndex
from deepinfer.constraints.vocab import Vocabulary

TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
rng = np.random.default_rng(0)
out = {"mode": native.STATE.mode, "why": native.STATE.why, "checked": 0, "codes": native._CODES is not None}
for trial in range(TRIALS):
    n, c = int(rng.integers(1, 12)), int(rng.integers(1, 6))
    table = rng.integers(-1, n, size=(n, c)).astype(np.int32)
    sizes = rng.integers(1, 60, size=c).astype(np.int64)
    bound = native.bind(rows.count_bytes, table, sizes)  # (its tables' types checked once)
    for s in range(n):
        assert rows.count_bytes(table, sizes, s) == rows._count_bytes_py(table, sizes, s)
        assert bound(s) == rows._count_bytes_py(table, sizes, s)
        out["checked"] += 1
    toks = [bytes(rng.integers(97, 100, size=int(rng.integers(1, 5))).tolist()) for _ in range(60)]
    vocab = Vocabulary(toks)
    idx = VocabIndex(vocab)
    cls = rng.integers(0, c, size=256).astype(np.int32)
    bnd = rng.random(n) < 0.3
    for s in range(n):
        a = np.zeros(idx.n_words, dtype=np.uint32)
        b = np.zeros(idx.n_words, dtype=np.uint32)
        bn, bs, st = (np.empty(idx.n_nodes, np.int32), np.empty(idx.n_nodes, np.int32),
                      np.empty(idx.max_depth + 2, np.int32))
        args = (table, cls, np.int32(s), idx.node_byte, idx.node_depth, idx.node_skip, idx.tok_lo,
                idx.tok_hi, idx.tok_ids, 0, idx.n_nodes, 0, bnd)
        k = trie._walk(*args, a, bn, bs, st)
        k_ref = trie._walk_py(*args, b, bn.copy(), bs.copy(), st.copy())
        assert k == k_ref and (a == b).all()
        out["checked"] += 1
out["misses"] = len(native.STATE.misses)
out["before"] = native.STATE.mode
# a bound kernel given an argument type the build has no signature for (an int32 state):
# the JIT takes over, with the same result, and the kernels bound before it run the JIT too
t32 = np.zeros((2, 2), dtype=np.int32)
b32 = native.bind(rows.count_bytes, t32, np.ones(2, np.int64))
out["bound_miss"] = bool(int(b32(np.int32(0))) == 2) and native.STATE.mode == "jit"
out["bound_after"] = all(bound(s) == rows._count_bytes_py(table, sizes, s) for s in range(n))
# a dtype the build has no signature for: the JIT takes over, with the same result
t64 = np.zeros((2, 2), dtype=np.int64)
out["int64"] = bool(int(rows.count_bytes(t64, np.ones(2, np.int64), 0)) == rows._count_bytes_py(
    t64, np.ones(2, np.int64), 0))
out["after"] = native.STATE.mode
print("RESULT " + json.dumps(out))
"""


def _run(code: str, env: dict, timeout: int = 400, *args: str) -> str:
    full = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=ROOT,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _result(stdout: str) -> dict:
    return json.loads([x for x in stdout.splitlines() if x.startswith("RESULT ")][-1][7:])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kernels")
    so = (
        _run(
            BUILD.format(folder=str(folder), only=ONLY),
            {"DEEPINFER_KERNELS": "jit", "DEEPINFER_TRIE_CACHE": "0"},
        )
        .strip()
        .splitlines()[-1]
    )
    assert Path(so).exists() and Path(so).parent == folder
    return folder, Path(so)


def test_aot_kernels_match_their_references(built):
    folder, _ = built
    r = _result(_run(CHECK, {"DEEPINFER_CACHE_DIR": str(folder), "DEEPINFER_KERNELS": "auto"}))
    assert r["mode"] == "aot", r["why"]
    assert r["codes"]  # (calls keyed by their arguments' codes: arg_codes.c)
    assert r["checked"] > 100 and r["misses"] == 0 and r["before"] == "aot"
    # an argument type outside the build: numba's JIT from then on, same result
    assert r["bound_miss"] and r["bound_after"]
    assert r["int64"] and r["after"] == "jit"


def test_corrupt_or_stale_build_is_not_loaded(built, tmp_path):
    folder, so = built
    bad = tmp_path / "bad"
    bad.mkdir()
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: its hash no longer matches the manifest
    (bad / so.name).write_bytes(bytes(data))
    manifest = next(folder.glob("_deepinfer_kernels_*.json"))
    (bad / manifest.name).write_text(manifest.read_text())
    r = _result(_run(CHECK, {"DEEPINFER_CACHE_DIR": str(bad), "DEEPINFER_KERNELS": "auto"}, 400, "2"))
    assert r["mode"] == "jit" and "does not match" in r["why"], r
    assert r["checked"] > 5
    # a build of other source (another key) is never found: the JIT
    stale = tmp_path / "stale"
    stale.mkdir()
    key = native.build_key()
    for f in folder.iterdir():
        if f.is_file():
            (stale / f.name.replace(key, "0" * len(key))).write_bytes(f.read_bytes())
    r = _result(_run(CHECK, {"DEEPINFER_CACHE_DIR": str(stale), "DEEPINFER_KERNELS": "auto"}, 400, "2"))
    assert r["mode"] == "jit" and "no build" in r["why"], r


def _random_arrays(rng, n: int, dtypes: list, shapes: list) -> list:
    """``n`` arrays of the given dtypes and shapes: C, F (transposed or converted) or neither
    (strided), 30% of them read-only."""
    out = []
    for _ in range(n):
        a = np.zeros(rng.choice(shapes), dtype=rng.choice(dtypes))
        r = rng.random()
        if r < 0.2 and a.ndim > 1:
            a = a.T
        elif r < 0.4 and a.ndim == 1 and len(a) > 2:
            a = a[::2]
        elif r < 0.5:
            a = np.asfortranarray(a)
        if rng.random() < 0.3:
            a.flags.writeable = False
        out.append(a)
    return out


def test_arg_types_are_numbas_typeof():
    from numba import typeof

    arrays = [
        np.zeros((3, 4), dtype=np.int32),
        np.zeros((3, 4), dtype=np.int32)[:, ::2],  # neither C nor F: "A"
        np.asfortranarray(np.zeros((3, 4), dtype=np.int64)),
        np.zeros(5, dtype=np.uint32),
        np.zeros(5, dtype=np.bool_),
        np.zeros(0, dtype=np.int8),
    ]
    ro = np.zeros(4, dtype=np.int16)
    ro.flags.writeable = False
    values = [*arrays, ro, 3, True, 2.5, np.int32(7), np.int64(-1), np.bool_(False)]
    for v in values:
        assert native._arg_type(v) == native._numba_type(typeof(v)), v


def test_literal_overloads_are_not_exported():
    """A jitted caller that passes a constant compiles its callee for that value
    (``Literal[int](3)``), which reads as an int64 like any other: exported, a Python call
    of the callee with another int would find it by its signature and run it with the
    constant. Such overloads are left out of the build, and no kernel of the package's
    build has two exports of one signature."""
    from numba import types

    assert native._numba_type(types.IntegerLiteral(3)) is None
    assert native._numba_type(types.BooleanLiteral(True)) is None
    assert native._numba_type(types.int64) == "<i8"
    if native.STATE.mode != "aot":
        pytest.skip(f"the kernels run as {native.STATE.mode}, not from a build ({native.STATE.why})")
    for name, exports in native.STATE.manifest["kernels"].items():
        sigs = [json.dumps(args) for args, _ in exports]
        assert len(set(sigs)) == len(sigs), name


def test_argument_types_kept_per_dtype_and_flags_equal_numbas_reading():
    """``native._arg_type`` (an array's kept by dtype, dimensions and flags) and ``_arg_id``
    against ``_arg_type_of`` (read afresh) on arrays of every layout, byte order and write
    flag, and on scalars."""
    import random

    from deepinfer.constraints.native import _arg_id, _arg_type, _arg_type_of, _type_id

    dtypes = [np.int32, np.int64, np.uint32, np.uint8, np.bool_, np.float64, ">i4", "<i4"]
    for a in _random_arrays(random.Random(0), 2000, dtypes, [(5,), (3, 4), (0,), (2, 3, 2)]):
        assert _arg_type(a) == _arg_type_of(a)
        assert _arg_id(a) == _type_id(_arg_type_of(a))  # (the call-time check's key)
    for x in (3, 2.5, True, np.int64(4), np.float32(1.0), np.bool_(True), np.int32(2), "x"):
        assert _arg_type(x) == _arg_type_of(x)
        assert _arg_id(x) == _type_id(_arg_type_of(x))


def test_argument_codes_name_one_type_each(tmp_path):
    """``arg_codes.codes`` on arrays of every layout, byte order, write flag and dimension, and
    on scalars: arguments with the same code have the same type (``_arg_type_of``), so a call
    keyed by its codes finds the signature its types would; a byte-swapped array and an object
    of another type have none (the call is checked in Python)."""
    import random

    from deepinfer.constraints import arg_codes
    from deepinfer.constraints.native import _arg_type_of

    try:
        arg_codes.build(str(tmp_path))
    except RuntimeError as e:
        pytest.skip(f"no C compiler: {e}")
    codes = arg_codes.load(str(tmp_path))
    assert codes is not None, arg_codes.why
    seen: dict = {}
    values: list = [3, -2, 2.5, True, False, np.int64(4), np.float32(1.0), np.bool_(True), np.int32(2)]
    dtypes = [np.int32, np.int64, np.uint32, np.uint8, np.int16, np.bool_, np.float64, np.float32]
    values += _random_arrays(random.Random(1), 3000, dtypes, [(5,), (3, 4), (0,), (2, 3, 2), (1,), (4, 1)])
    got = codes(tuple(values))
    assert got is not None and len(got) == len(values)
    for c, v in zip(got, values):
        assert seen.setdefault(c, _arg_type_of(v)) == _arg_type_of(v), (c, v)
    assert len(seen) > 40
    assert codes((np.zeros(3, dtype=">i4"),)) is None and codes((np.zeros(2), "x")) is None
    assert codes(()) == ()


# a kernel that calls two others (hopcroft, _columns), one of them called from Python too
INNER = """
import json, sys
import numpy as np
from deepinfer.constraints import native
from deepinfer.constraints.tokens import rows

def run():
    rows.unquoted_region(np.full((1, 1), -1, dtype=np.int32), np.zeros(256, dtype=np.int32), 0x22,
                         np.zeros(1, dtype=np.bool_), 0, 4, np.full(1, -1, dtype=np.int32))

if sys.argv[1] == "warm":
    run()  # numba's disk cache now holds the three, the callees inside their caller's code
else:
    only = {"deepinfer.constraints.tokens.rows." + k for k in ("unquoted_region", "_columns")}
    only.add("deepinfer.constraints.automaton.dfa_kernels.hopcroft")
    so = native.build(run, sys.argv[2], only=only)
    man = native._paths(native.build_key(), sys.argv[2])[1]
    print("RESULT " + json.dumps(sorted(json.load(open(man))["kernels"])))
"""


def test_build_compiles_kernels_afresh_with_numbas_cache_warm(tmp_path):
    """A build learns each kernel's signatures from the workload under the JIT. With numba's
    disk cache warm (a process ran the kernels before), a kernel called only inside another
    would come in inside its caller's cached code and miss from the build, though Python
    calls it elsewhere: every kernel is compiled afresh instead."""
    env = {"DEEPINFER_KERNELS": "jit", "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    _run(INNER, env, 400, "warm")
    assert any((tmp_path / "numba").rglob("*.nbi"))
    got = _result(_run(INNER, env, 400, "build", str(tmp_path / "kernels")))
    assert got == sorted(
        [
            "deepinfer.constraints.automaton.dfa_kernels.hopcroft",
            "deepinfer.constraints.tokens.rows._columns",
            "deepinfer.constraints.tokens.rows.unquoted_region",
        ]
    )
