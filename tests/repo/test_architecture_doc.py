"""docs/architecture.md's "Where to look" table against the tree: every module of the
package is named there, and every file or folder it names exists, so a newcomer who
reads it finds what is there and nothing that is not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import REPO

DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "exporter" / "stepscope"
# Generated gRPC stubs (named as a folder in the kubernetes row) and entry points.
UNNAMED = {"__init__.py", "__main__.py"}
GENERATED = {"attribution/podresources"}


def table(text: str) -> dict[str, str]:
    """The table's rows: first column's path -> the row's description."""
    section = text.split("## Where to look", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            for path in re.findall(r"`([^`]+)`", cells[0]):
                rows[path] = cells[1]
    return rows


def named_modules(rows: dict[str, str]) -> set[str]:
    """Every module path (relative to the package) the table names: a row that is a file,
    or ``name.py`` (and ``folder/``) mentioned in a folder row's description."""
    named = set()
    for path, description in rows.items():
        if path.endswith("/"):
            for name in re.findall(r"`([\w/]+(?:\.py|/))`", description):
                named.add(path + name)
        else:
            named.add(path)
    return named


def package_modules() -> set[str]:
    out = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name in UNNAMED or any(rel.startswith(g + "/") for g in GENERATED):
            continue
        out.add(rel)
    return out


ROWS = table(DOC.read_text())


def test_the_table_has_a_row_for_every_package_of_the_exporter() -> None:
    packages = {
        p.relative_to(PACKAGE).as_posix() + "/"
        for p in PACKAGE.iterdir()
        if (p / "__init__.py").exists()
    }
    assert packages - ROWS.keys() == set()


def test_every_module_is_named_in_the_table() -> None:
    missing = package_modules() - named_modules(ROWS)
    assert not missing, f"docs/architecture.md's table does not name {sorted(missing)}"


@pytest.mark.parametrize("named", sorted(named_modules(ROWS)))
def test_every_name_in_the_table_exists(named: str) -> None:
    assert (PACKAGE / named).exists(), f"docs/architecture.md names {named}, which is gone"


def test_the_checker_sees_a_module_the_table_does_not_name(tmp_path: Path) -> None:
    doc = (
        "## Where to look\n\n| Folder / file | What |\n| --- | --- |\n"
        "| `core/` | `sampler.py` (passes), `snapshot.py` |\n| `app/cli.py` | the command |\n"
        "\n## Next\n"
    )
    rows = table(doc)
    assert rows.keys() == {"core/", "app/cli.py"}
    assert named_modules(rows) == {"core/sampler.py", "core/snapshot.py", "app/cli.py"}
    assert "core/labels.py" not in named_modules(rows)
