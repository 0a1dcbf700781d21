"""The package layout, read from the code's own imports with ``ast``.

- ``deepinfer.constraints`` and ``deepinfer.kernels`` import nothing of the engine;
- ``import deepinfer.constraints`` does not import torch;
- no import cycles among the package's modules (imports inside functions count too);
- no module imports another module's private (``_name``) names.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package name -> folder (pyproject's package-dir)
PACKAGES = {
    "deepinfer": ROOT / "deepinfer",
    "deepinfer.constraints": ROOT / "constraints",
    "deepinfer.kernels": ROOT / "kernels",
    "deepinfer.grammars": ROOT / "grammars",
}
# parts that import nothing of the engine: only themselves and these
STANDALONE = {
    "deepinfer.constraints": ("deepinfer.constraints", "deepinfer.grammars"),
    "deepinfer.kernels": ("deepinfer.kernels",),
}


def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    mods: dict[str, Path] = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            mods[".".join((pkg, *rel))] = path
    return mods


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _imports(name: str, path: Path) -> list[tuple[str, str | None, int]]:
    """(module imported, name taken from it or None, line) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    base = name if _is_package(name) else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                mod = f"{parent}.{node.module}" if node.module else parent
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.append((sub, None, node.lineno) if sub in MODULES else (mod, a.name, node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, path in MODULES.items():
        for target, _, _ in _imports(m, path):
            while target and target not in MODULES:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != m:
                edges[m].add(target)
    return edges


def test_the_layout_is_read():
    assert "deepinfer.llm" in MODULES and "deepinfer.constraints.compiler" in MODULES
    assert "deepinfer.kernels" in MODULES


@pytest.mark.parametrize("part", sorted(STANDALONE))
def test_part_imports_nothing_of_the_engine(part):
    allowed = STANDALONE[part]
    bad = []
    for m, path in MODULES.items():
        if m != part and not m.startswith(part + "."):
            continue
        for target, _, line in _imports(m, path):
            if target.split(".")[0] != "deepinfer":
                continue
            if not any(target == a or target.startswith(a + ".") for a in allowed):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    edges = _graph()
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    # A package's __init__ re-exporting its modules, which import their siblings through the
    # package (`from . import x` resolves to the module x, so that is not an edge to __init__),
    # would show here: none is allowed.
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_private_names_across_modules():
    bad = []
    for m, path in MODULES.items():
        for target, name, line in _imports(m, path):
            if name is None or not name.startswith("_") or name.startswith("__"):
                continue
            if target.split(".")[0] == "deepinfer" and target != m:
                bad.append(f"{path.relative_to(ROOT)}:{line} takes {name} from {target}")
    assert not bad, "\n".join(bad)


def test_constraints_import_without_torch():
    code = "import sys, deepinfer.constraints; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
