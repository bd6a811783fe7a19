"""Writing generated files: only those whose bytes change, so a rerun touches nothing and
says what it wrote."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def sync(repo: Path, files: Mapping[Path, str | bytes]) -> list[str]:
    """Make each file (a path relative to ``repo``) hold its content, replacing a symbolic
    link by a real file; one line per file written."""
    written = []
    for rel, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        path = repo / rel
        if path.is_symlink():
            path.unlink()
        elif path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(f"{rel}: written")
    return written
