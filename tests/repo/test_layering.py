"""The layering the architecture promises, checked on the source (AST, no imports run).

- the core (``stepscope.core``) imports no other stepscope package;
- what the SDK and the exporter share (``stepscope.shared``: the datagram schema, the NCCL
  log parser) imports nothing of stepscope;
- the sources (``gpu``, ``ingest``, ``host``, ``net``, ``aws``, ``attribution``) import the
  core and the shared schema, never each other: data flows through the Snapshot;
- the diagnosis reads every source's part, and nothing reads the diagnosis but the app;
- the SDK (``stepscope.train``) imports only itself and ``stepscope.shared``, so a training
  process never loads the exporter;
- only the application (``stepscope.app``) wires everything together;
- no module imports itself back through others: no import cycle, counting imports inside
  functions, ``TYPE_CHECKING`` blocks and ``importlib.import_module("stepscope...")``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

PACKAGE = REPO / "exporter" / "stepscope"
SOURCES = ("gpu", "ingest", "host", "net", "aws", "attribution")
# layer -> the stepscope layers it may import (besides itself and the bare package)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "shared": set(),
    "train": {"shared"},
    **{s: {"core", "shared"} for s in SOURCES},
    "diagnose": {"core", "shared", *SOURCES},
    "web": {"core"},
}
APP = {"app", "__main__"}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        out[".".join(rel.parts).removesuffix(".__init__")] = path
    return out


def _resolve(base: str, name: str, known: set[str]) -> str:
    """``from base import name``: the submodule ``base.name`` when there is one."""
    candidate = f"{base}.{name}"
    return candidate if candidate in known else base


def imports(path: Path, known: set[str] | None = None) -> set[str]:
    """Every stepscope module ``path`` imports: at the top, inside functions, under
    ``TYPE_CHECKING`` and as ``importlib.import_module("stepscope...")`` strings."""
    known = known if known is not None else set(module_names())
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("stepscope")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "stepscope" or node.module.startswith("stepscope."):
                for alias in node.names:
                    if alias.name != "__version__":
                        found.add(_resolve(node.module, alias.name, known))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and str(arg.value).startswith("stepscope"):
                found.add(str(arg.value))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in {"import_module", "__import__"}


def layering_violations(module: str, path: Path, known: set[str]) -> list[str]:
    """The imports of ``module`` its layer may not make."""
    layer = layer_of(module)
    if layer in APP or module == "stepscope":
        return []
    assert layer in ALLOWED, f"{module}: new top-level layer {layer!r}; add it to ALLOWED"
    allowed = ALLOWED[layer] | {layer, ""}
    return sorted(m for m in imports(path, known) if layer_of(m) not in allowed)


def cycles(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    yield from found


MODULES = module_names()


@pytest.mark.parametrize(("module", "path"), sorted(MODULES.items()), ids=sorted(MODULES))
def test_imports_follow_the_layers(module: str, path: Path) -> None:
    wrong = layering_violations(module, path, set(MODULES))
    assert not wrong, f"{module} ({layer_of(module)}) must not import {wrong}"


def test_the_package_has_no_import_cycle() -> None:
    known = set(MODULES)
    graph = {name: imports(path, known) - {name} for name, path in MODULES.items()}
    assert list(cycles(graph)) == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """A core module importing a source, at the top and through importlib, is named."""
    core = tmp_path / "bad.py"
    core.write_text(
        "import importlib\n"
        "from stepscope.gpu.model import GPU_PART\n"
        "def f():\n"
        "    return importlib.import_module('stepscope.diagnose.engine')\n"
    )
    known = set(MODULES)
    assert imports(core, known) == {"stepscope.gpu.model", "stepscope.diagnose.engine"}
    assert layering_violations("stepscope.core.bad", core, known) == [
        "stepscope.diagnose.engine",
        "stepscope.gpu.model",
    ]


def test_the_checker_sees_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    """Two modules importing each other, one of them lazily, are a cycle."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from stepscope.train import b\n")
    b.write_text("def f():\n    from stepscope.train.a import x\n    return x\n")
    known = {"stepscope.train", "stepscope.train.a", "stepscope.train.b"}
    graph = {"stepscope.train.a": imports(a, known), "stepscope.train.b": imports(b, known)}
    assert list(cycles(graph)) == [["stepscope.train.a", "stepscope.train.b"]]
