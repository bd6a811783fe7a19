"""The layering the architecture promises, checked on the source (AST, no imports run).

- the core (``stepscope.core``) imports no domain package;
- the sources (``gpu``, ``ingest``, ``host``, ``net``, ``aws``, ``attribution``) import the
  core and the datagram schema, never each other: data flows through the Snapshot;
- the diagnosis reads every source's part, and nothing reads the diagnosis but the app;
- the SDK (``stepscope.train``) imports only itself, the datagram schema and the NCCL
  log parser (``nccl_log``, shared with ``nccl-check``), so a training process never
  loads the exporter;
- only the app layer (``serve``, ``cli``, ``sources``) wires everything together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "exporter" / "stepscope"
SOURCES = ("gpu", "ingest", "host", "net", "aws", "attribution")
# layer -> the stepscope layers it may import (besides itself and the bare package)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "datagram": set(),
    "yamltext": set(),
    "logformat": set(),
    "nccl_log": {"datagram"},  # the NCCL log parser: nccl-check and the SDK share it
    "healthcheck": {"config"},  # the image's HEALTHCHECK: reads the listen address
    "train": {"datagram", "nccl_log"},
    **{s: {"core", "datagram"} for s in SOURCES},
    "diagnose": {"core", "datagram", "yamltext", "nccl_log", *SOURCES},
    "config": {"core", "datagram", "diagnose", "ingest", "yamltext", "logformat"},
    "webconfig": {"config", "yamltext"},
}
APP = {"serve", "cli", "sources", "__main__"}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports(path: Path) -> set[str]:
    """Every stepscope module ``path`` imports (TYPE_CHECKING-only imports included)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("stepscope")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "stepscope":
                found |= {f"stepscope.{a.name}" for a in node.names if a.name != "__version__"}
            elif node.module.startswith("stepscope."):
                found.add(node.module)
    return found


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        out.append((".".join(rel.parts).removesuffix(".__init__"), path))
    return out


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_imports_follow_the_layers(module: str, path: Path) -> None:
    layer = layer_of(module)
    if layer in APP or module == "stepscope":
        return
    assert layer in ALLOWED, f"{module}: new top-level layer {layer!r}; add it to ALLOWED"
    allowed = ALLOWED[layer] | {layer, ""}
    wrong = sorted(m for m in imports(path) if layer_of(m) not in allowed)
    assert not wrong, f"{module} ({layer}) must not import {wrong}"


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from stepscope.gpu.model import GPU_PART\nimport stepscope.diagnose.engine\n")
    assert imports(bad) == {"stepscope.gpu.model", "stepscope.diagnose.engine"}
    assert layer_of("stepscope.gpu.model") not in ALLOWED["core"]
