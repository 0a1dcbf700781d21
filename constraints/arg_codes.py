"""The type codes of a kernel call's arguments, in one C call (``arg_codes.c``): what
:class:`.native.Kernel` reads before every call of an ahead-of-time kernel, where the
per-argument check in Python (:func:`.native._arg_id`) costs about 0.2 µs an argument, so 5 to
10 µs for a walk of the trie's 30 to 45 arguments. A code determines the argument's type as
the manifest writes it (an array's dtype, dimensions, layout and write flag; a scalar's type);
an argument without one (another type, a subclass, a byte-swapped dtype) makes
:func:`codes` return None, and the caller checks that call in Python.

Built beside the kernels' build (:func:`.native_build.main`, so ``./build.sh install``) with
the C compiler (``CC``, else ``cc``) against this Python's and numpy's headers, into
:func:`.native.cache_dir` under a key hashing its source, the Python, numpy and the machine, with
a manifest of its SHA-256; written to a temporary file and renamed, and loaded only when it
matches its manifest. Without a build, or with ``DEEPINFER_ARG_CODES=0``, every call is checked
in Python (the same kernels run)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import sys

import numpy as np

ENV = "DEEPINFER_ARG_CODES"  # "0": never load the build (every call checked in Python)
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arg_codes.c")


def build_key() -> str:
    h = hashlib.sha256()
    with open(_SOURCE, "rb") as f:
        h.update(f.read())
    h.update(f"{sys.version}|{sys.implementation.cache_tag}|{np.__version__}|{platform.machine()}".encode())
    return h.hexdigest()[:20]


def _name(key: str) -> str:
    return f"_deepinfer_arg_codes_{key}"


def build_paths(folder: str, key: str | None = None) -> tuple[str, str]:
    """The extension and manifest paths of the build of ``key`` (default: this source's) in
    ``folder`` (the kernels' :func:`.native.cache_dir`, which its callers pass)."""
    from importlib.machinery import EXTENSION_SUFFIXES

    base = os.path.join(folder, _name(key or build_key()))
    return base + EXTENSION_SUFFIXES[0], base + ".json"


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def build(folder: str) -> str:
    """Compile the extension into ``folder`` (atomically, with its manifest); its path."""
    import shutil
    import subprocess
    import sysconfig
    import tempfile

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc, gcc or $CC) found")
    key = build_key()
    so, man = build_paths(folder, key)
    os.makedirs(os.path.dirname(so), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(so), suffix=".so.tmp")
    os.close(fd)
    try:
        name = _name(key)
        includes = [f"-I{sysconfig.get_paths()['include']}", f"-I{np.get_include()}"]
        names = [f"-DARG_CODES_INIT=PyInit_{name}", f'-DARG_CODES_NAME="{name}"']
        cmd = [cc, "-O2", "-shared", "-fPIC", *includes, *names, "-o", tmp, _SOURCE]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(so), suffix=".json.tmp", delete=False) as f:
            json.dump({"key": key, "sha256": _sha(tmp), "compiler": cc}, f)
        os.replace(tmp, so)
        os.replace(f.name, man)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"{cc} failed on {_SOURCE}: {e.stderr.strip()}") from None
    except OSError as e:
        raise RuntimeError(f"cannot run the C compiler {cc!r} or write {so}: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return so


def load(folder: str):
    """This source's ``codes`` function when its build is there and matches its manifest, else
    None (with :data:`why` saying why)."""
    global why
    try:
        key = build_key()
        so, man = build_paths(folder, key)
        if not (os.path.exists(so) and os.path.exists(man)):
            why = f"no build in {os.path.dirname(so)}"
            return None
        with open(man, encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("key") != key or meta.get("sha256") != _sha(so):
            why = f"build {so} does not match its manifest (stale or corrupt): not loaded"
            return None
        spec = importlib.util.spec_from_file_location(_name(key), so)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001 - any failure: the Python check instead
        why = f"build not loaded: {type(e).__name__}: {e}"
        return None
    why = ""
    return mod.codes


why = "not loaded yet"
