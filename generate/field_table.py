"""docs/metrics.md's per-GPU field table, from the field table in the code
(``stepscope.gpu.fields``): between its BEGIN and END markers, nothing else touched."""

from __future__ import annotations

from pathlib import Path

from generate.constants import METRICS_DOC, REPO
from generate.files import sync
from stepscope.gpu.fields import markdown_table

BEGIN = "<!-- BEGIN FIELD TABLE (generated: python -m generate) -->"
END = "<!-- END FIELD TABLE -->"


def embed(doc: str) -> str:
    """``doc`` with the table between the markers made anew."""
    head, rest = doc.split("<!-- BEGIN FIELD TABLE", 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{markdown_table()}{END}{tail}"


def write(repo: Path = REPO) -> list[str]:
    """Make docs/metrics.md's table current; one line per file written."""
    doc = (repo / METRICS_DOC).read_text()
    return sync(repo, {METRICS_DOC: embed(doc)})
