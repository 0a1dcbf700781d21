"""Native kernels: one module compiled ahead of time, or numba's JIT.

Every numba kernel of the package is registered here with :func:`kernel` (its pure-Python
function stays the reference). How a kernel runs is settled once per process, at import:

- **ahead of time** (AOT): a C extension that :func:`build` compiles with numba's ``pycc``
  from the kernels' own source, for the argument types a warm-up workload meets. Loading it
  takes about a millisecond and imports no numba, where numba's JIT takes about a second
  per process (importing numba, its type system, and loading each kernel from its disk
  cache). ``./build.sh install`` builds it; so does
  ``python -m deepinfer.constraints.native_build`` (:mod:`.native_build`).
- **JIT**: ``numba.njit(cache=True, nogil=True)``, numba's disk cache next to the module,
  or in numba's user-wide cache folder when the package folder is read-only
  (``NUMBA_CACHE_DIR`` overrides both). This is the path of a first run on a clean machine.

The build is found in :func:`cache_dir` (``DEEPINFER_CACHE_DIR``, else
``$XDG_CACHE_HOME/deepinfer``, else ``~/.cache/deepinfer``) under a name holding the key of
what it was built from: a hash of the kernel modules' source, the Python, numpy and machine
(:func:`build_key`). Any change to a kernel gives another key, so a stale build is never
loaded. A sidecar manifest holds the build's SHA-256 and the argument types of each
exported signature; a file that does not match its hash (corrupt, half written) is not
loaded, and :func:`build` writes both atomically. At each call an AOT kernel checks its
arguments' types against the exported signatures (numba's ``typeof``: dtype, dimensions,
layout, read-only), since a compiled signature does not check dtypes (a wrong one reads
memory as another type, or past the array); a kernel bound to its tables (:func:`bind`)
checks those once. Arguments no signature takes switch the process to the JIT
(:func:`use_jit`), which is always correct. ``DEEPINFER_KERNELS=jit`` forces the JIT,
``=aot`` makes a missing build or signature an error (for the tests of the build).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import platform
import sys
import threading

import numpy as np

ENV_MODE = "DEEPINFER_KERNELS"  # "auto" (default), "jit", "aot"
ENV_CACHE = "DEEPINFER_CACHE_DIR"
_HERE = os.path.dirname(os.path.abspath(__file__))
# the modules whose kernels the build compiles (their source is the build's key)
KERNEL_MODULES = (
    "automaton/dfa_kernels.py",
    "automaton/minimize.py",
    "automaton/nfa_kernels.py",
    "automaton/subset.py",
    "tokens/rows.py",
    "tokens/trie.py",
    "tag_check.py",
)
_PACKAGE = __package__ or __name__.rpartition(".")[0]


class _State:
    mode = "python"  # "aot" or "jit" or "python" (numba missing): how kernels run now
    aot = None  # the loaded extension
    manifest: dict = {}
    why = ""  # why the AOT build is not in use
    misses: list = []  # (kernel, argument types) the build had no signature for


STATE = _State()
_KERNELS: list[Kernel] = []
# the arguments' type codes in one C call (.arg_codes), loaded with the AOT build; None: every
# call checks its arguments in Python (_arg_id)
_CODES = None
_LOCK = threading.Lock()


def cache_dir() -> str:
    """Where the AOT build lives: ``DEEPINFER_CACHE_DIR``, else the user's cache folder."""
    d = os.environ.get(ENV_CACHE)
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "deepinfer")


BUILD_FORMAT = 2  # what build() exports (2: no literal overloads); a build of another is stale


def build_key() -> str:
    """The hash of what a build depends on: the kernel modules' source, the Python, numpy,
    the machine."""
    h = hashlib.sha256()
    for rel in KERNEL_MODULES:
        with open(os.path.join(_HERE, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + f.read() + b"\0")
    h.update(f"{sys.version}|{sys.implementation.cache_tag}|{np.__version__}|{platform.machine()}".encode())
    h.update(f"|format {BUILD_FORMAT}".encode())
    return h.hexdigest()[:20]


def _module_name(key: str) -> str:
    return f"_deepinfer_kernels_{key}"


def _paths(key: str, folder: str | None = None) -> tuple[str, str]:
    from importlib.machinery import EXTENSION_SUFFIXES

    folder = folder or cache_dir()
    name = _module_name(key)
    return os.path.join(folder, name + EXTENSION_SUFFIXES[0]), os.path.join(folder, name + ".json")


def build_paths(folder: str | None = None) -> tuple[str, str]:
    """The extension and manifest paths of this source's build in ``folder``."""
    return _paths(build_key(), folder)


def _file_sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _load_aot() -> None:
    """Load the build of this source, if there is a whole one (else say why not)."""
    try:
        key = build_key()
        so, man = _paths(key)
        if not (os.path.exists(so) and os.path.exists(man)):
            STATE.why = f"no build for key {key} in {os.path.dirname(so)}"
            return
        with open(man, encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("key") != key or manifest.get("sha256") != _file_sha(so):
            STATE.why = f"build {so} does not match its manifest (stale or corrupt): not loaded"
            return
        spec = importlib.util.spec_from_file_location(_module_name(key), so)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001 - any failure: the JIT instead
        STATE.why = f"build not loaded: {type(e).__name__}: {e}"
        return
    STATE.aot, STATE.manifest, STATE.mode = mod, manifest, "aot"


_ND_TYPES: dict = {}  # (dtype, ndim, flags) -> _arg_type of such an array
# a scalar's type -> its _arg_type (Python's bool, int and float; numpy's scalar types)
_SCALAR_TYPES: dict = {bool: "|b1", int: "<i8", float: "<f8"}


def _arg_type(x):
    """numba's ``typeof`` of an argument, as the manifest writes it (an array's by its dtype,
    dimensions and flags, kept: every kernel call reads it for each argument; a scalar's by
    its type)."""
    t = type(x)
    if t is np.ndarray:
        key = (x.dtype, x.ndim, x.flags.num)
        hit = _ND_TYPES.get(key)
        if hit is None:
            hit = _ND_TYPES[key] = _arg_type_of(x)
        return hit
    hit = _SCALAR_TYPES.get(t)
    if hit is not None:
        return hit
    hit = _arg_type_of(x)
    if t in _NUMPY_SCALARS:  # (a numpy scalar's dtype is its type's)
        _SCALAR_TYPES[t] = hit
    return hit


# each argument type :func:`_arg_type` writes, as a small int (a call's signature is then a
# tuple of ints: quick to hash); arrays by (dtype, ndim, flags), scalars by their type
_TYPE_IDS: dict = {}
_ND_IDS: dict = {}
_SCALAR_IDS: dict = {}


def _type_id(t) -> int:
    i = _TYPE_IDS.get(t)
    if i is None:
        i = _TYPE_IDS[t] = len(_TYPE_IDS)
    return i


def _arg_id(x) -> int:
    """:func:`_type_id` of :func:`_arg_type` of ``x``, kept per array dtype, dimensions and
    flags and per scalar type (what every kernel call reads for each argument)."""
    t = type(x)
    if t is np.ndarray:
        key = (x.dtype, x.ndim, x.flags.num)
        hit = _ND_IDS.get(key)
        if hit is None:
            hit = _ND_IDS[key] = _type_id(_arg_type(x))
        return hit
    hit = _SCALAR_IDS.get(t)
    if hit is None:
        hit = _type_id(_arg_type(x))
        if t in _SCALAR_TYPES:  # (Python's scalars and numpy's: the type decides)
            _SCALAR_IDS[t] = hit
    return hit


_CODE_IDS: dict = {}  # an argument code (_CODES) -> the _type_id of its type


def _ids_of(codes: tuple, args: tuple) -> tuple:
    """The _type_id ints of ``args`` from their ``codes`` (a code names one type: each code's
    id is read once, from the first argument met with it)."""
    try:
        return tuple(map(_CODE_IDS.__getitem__, codes))
    except KeyError:
        for c, x in zip(codes, args):
            if c not in _CODE_IDS:
                _CODE_IDS[c] = _arg_id(x)
        return tuple(map(_CODE_IDS.__getitem__, codes))


_NUMPY_SCALARS = frozenset(
    (
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float32,
        np.float64,
    )
)


def _arg_type_of(x):
    if isinstance(x, np.ndarray):
        f = x.flags
        return (
            x.dtype.str,
            x.ndim,
            "C" if f.c_contiguous else ("F" if f.f_contiguous else "A"),
            not f.writeable,
        )
    if isinstance(x, (bool, np.bool_)):
        return "|b1"
    if isinstance(x, int):
        return "<i8"
    if isinstance(x, float):
        return "<f8"
    if isinstance(x, np.generic):
        return x.dtype.str
    return repr(type(x))


def _numba_type(t):
    """A numba type as :func:`_arg_type` writes it (None: not exportable). A literal (an
    int a jitted caller passes as a constant: ``Literal[int](3)``) is not exportable: its
    overload has the value compiled in, and a Python call with another int of the same
    written type would run it."""
    from numba import types
    from numba.np.numpy_support import as_dtype

    if isinstance(t, types.Literal):
        return None
    if isinstance(t, types.Array):
        return (as_dtype(t.dtype).str, t.ndim, t.layout, not t.mutable)
    if isinstance(t, (types.Integer, types.Float, types.Boolean)):
        return as_dtype(t).str
    return None


class Kernel:
    """A registered kernel: calls go to the AOT build's signature for the arguments'
    types, else to numba's dispatcher (the JIT; the pure-Python function without numba)."""

    def __init__(self, py_func, module: str, name: str, setup=None) -> None:
        self.py_func, self.module, self.name, self.setup = py_func, module, name, setup
        self.qualname = f"{module}.{name}"
        self.jit = None  # the numba dispatcher, once in JIT mode
        self._sigs: dict = {}  # argument types (as _type_id ints) -> the AOT function
        self._by_codes: dict = {}  # the arguments' codes (_CODES) -> the AOT function
        self.__doc__ = py_func.__doc__
        self.__wrapped__ = py_func

    def _bind_aot(self) -> None:
        for args, export in STATE.manifest.get("kernels", {}).get(self.qualname, []):
            sig = tuple(_type_id(tuple(a) if isinstance(a, list) else a) for a in args)
            self._sigs[sig] = getattr(STATE.aot, export)

    def __call__(self, *args):
        if self.jit is not None:
            return self.jit(*args)
        codes = _CODES(args) if _CODES is not None else None
        if codes is not None:
            f = self._by_codes.get(codes)
            if f is None:
                f = self._sigs.get(_ids_of(codes, args))
                if f is not None:
                    self._by_codes[codes] = f
        else:
            f = self._sigs.get(tuple(map(_arg_id, args)))
        if f is not None:
            return f(*args)
        STATE.misses.append((self.qualname, tuple(map(_arg_type, args))))
        if os.environ.get(ENV_MODE) == "aot":
            raise TypeError(f"{self.qualname}: the AOT build has no signature for {STATE.misses[-1][1]}")
        use_jit()
        return self.jit(*args)


class Bound:
    """A kernel with its leading arguments given once (:func:`bind`): their types
    are checked here, once, and a call checks only the arguments it adds. For a kernel
    called many times with the same tables and buffers, where checking every argument at
    every call would cost several times the call itself. The bound arrays must keep their
    dtype, shape and flags (the package's own tables and scratch buffers)."""

    __slots__ = ("kernel", "args", "codes", "ids", "by_codes")

    def __init__(self, k: Kernel, args: tuple) -> None:
        self.kernel, self.args = k, args
        self.codes = _CODES(args) if _CODES is not None else None
        self.ids = None if self.codes is not None else tuple(map(_arg_id, args))  # (without codes)
        self.by_codes: dict = {}  # the added arguments' codes -> the AOT function

    def __call__(self, *rest):
        k = self.kernel
        if k.jit is None:
            if self.codes is not None:
                codes = _CODES(rest)
                if codes is not None:
                    f = self.by_codes.get(codes)
                    if f is None:  # (another binding of the kernel may have met these types)
                        full = self.codes + codes
                        f = k._by_codes.get(full)
                        if f is None:
                            f = k._sigs.get(_ids_of(full, self.args + rest))
                            if f is not None:
                                k._by_codes[full] = f
                        if f is not None:
                            self.by_codes[codes] = f
                    if f is not None:
                        return f(*self.args, *rest)
            else:
                f = k._sigs.get(self.ids + tuple(map(_arg_id, rest)))
                if f is not None:
                    return f(*self.args, *rest)
        return k(*self.args, *rest)  # (the JIT, or a signature the build lacks: as any call)


def bind(k, *args):
    """Kernel ``k`` (as a module global names it: a :class:`Kernel`, or numba's dispatcher
    once the process runs the JIT) with ``args`` as its leading arguments."""
    if isinstance(k, Kernel):
        return Bound(k, args)
    return functools.partial(k, *args)


def kernel(py_func, module: str, name: str, setup=None):
    """Register ``py_func`` as the kernel ``module.name`` (the global it is bound to: in JIT
    mode the global becomes numba's dispatcher, so that kernels calling it compile against
    it). ``setup(module_globals)`` runs before its dispatcher is made (numba intrinsics)."""
    k = Kernel(py_func, module, name, setup)
    with _LOCK:
        _KERNELS.append(k)
        if STATE.mode == "aot":
            k._bind_aot()
            return k
        if STATE.mode == "jit":
            return _make_jit(k)
    return k  # pure Python (numba missing)


def _make_jit(k: Kernel):
    from numba import njit

    g = sys.modules[k.module].__dict__ if k.module in sys.modules else None
    if k.setup is not None and g is not None:
        k.setup(g)
    k.jit = njit(cache=True, nogil=True)(k.py_func)
    return k.jit


def use_jit() -> None:
    """Run every kernel through numba's JIT from now on (a signature the build lacks)."""
    with _LOCK:
        if STATE.mode == "jit":
            return
        try:
            import numba  # noqa: F401
        except ImportError:  # pragma: no cover - numba is a listed dependency
            STATE.mode = "python"
            for k in _KERNELS:
                k.jit = k.py_func
            return
        STATE.mode = "jit"
        for k in _KERNELS:
            _make_jit(k)
        for mod in {k.module for k in _KERNELS}:  # every global naming a kernel (aliases too)
            g = sys.modules.get(mod)
            for name, v in list(vars(g).items()) if g is not None else ():
                if isinstance(v, Kernel):
                    setattr(g, name, v.jit)


def _init() -> None:
    global _CODES
    mode = os.environ.get(ENV_MODE, "auto")
    if mode != "jit":
        _load_aot()
        if STATE.mode == "aot":
            from . import arg_codes

            if os.environ.get(arg_codes.ENV) != "0":
                _CODES = arg_codes.load(cache_dir())
            return
        if mode == "aot":
            raise ImportError(f"{ENV_MODE}=aot: {STATE.why}")
    try:
        import numba  # noqa: F401

        STATE.mode = "jit"
    except ImportError:  # pragma: no cover
        STATE.mode = "python"


_init()


# ------------------------------------------------------------------------------ build


def build(workload, folder: str | None = None, verbose: bool = False, only=None) -> str:
    """Compile every registered kernel (``only``: those qualified names) ahead of time into
    ``folder`` (default :func:`cache_dir`), for the signatures ``workload()`` meets under
    the JIT (:func:`.native_build.run`). Run in a process of its own in JIT mode
    (``DEEPINFER_KERNELS=jit``, as ``python -m deepinfer.constraints.native_build`` does).
    Returns the extension's path."""
    import shutil
    import tempfile

    if STATE.mode != "jit":
        raise RuntimeError(f"build() needs the JIT ({ENV_MODE}=jit), the kernels run as {STATE.mode}")
    key = build_key()  # (the source the modules were imported from: checked again at the end)
    _import_kernel_modules()
    from numba.core.caching import NullCache

    # every kernel compiled afresh, not loaded from numba's disk cache: a kernel that only
    # other kernels call would come in inside its callers' cached code and never compile as
    # itself, so its signatures (needed where Python calls it too) would be missing
    for k in _KERNELS:
        if k.jit is not None:
            k.jit._cache = NullCache()
    workload()
    from numba.core import compiler as _ncompiler
    from numba.pycc import CC
    from numba.pycc import compiler as _pycc_compiler

    class _NoGilFlags(_ncompiler.Flags):  # the exported wrappers release the GIL, as nogil=True does
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.release_gil = True

    folder = folder or cache_dir()
    os.makedirs(folder, exist_ok=True)
    name = _module_name(key)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=folder)
    try:
        cc = CC(name)
        cc.output_dir = tmp
        cc.verbose = verbose
        kernels: dict[str, list] = {}
        n = 0
        for k in _KERNELS:
            if only is not None and k.qualname not in only:
                continue
            for sig, cres in k.jit.overloads.items():
                args = [_numba_type(t) for t in sig]
                if any(a is None for a in args):
                    continue  # (an argument the call-time check cannot match: left to the JIT)
                export = f"k{n}"
                n += 1
                cc.export(export, cres.signature)(k.py_func)
                kernels.setdefault(k.qualname, []).append([args, export])
        saved = _pycc_compiler.Flags
        _pycc_compiler.Flags = _NoGilFlags
        try:
            cc.compile()
        finally:
            _pycc_compiler.Flags = saved
        built = [f for f in os.listdir(tmp) if f.startswith(name) and not f.endswith(".json")]
        so_tmp = os.path.join(tmp, built[0])
        if build_key() != key:
            raise RuntimeError("the kernels' source changed during the build: run it again")
        so, man = _paths(key, folder)
        manifest = {"key": key, "sha256": _file_sha(so_tmp), "kernels": kernels}
        with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as f:
            json.dump(manifest, f)
        os.replace(so_tmp, so)  # the extension first: a manifest never names a missing file
        os.replace(os.path.join(tmp, "manifest.json"), man)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return so


def _import_kernel_modules() -> None:
    import importlib

    for rel in KERNEL_MODULES:
        importlib.import_module(f"{_PACKAGE}." + rel[:-3].replace("/", "."))
