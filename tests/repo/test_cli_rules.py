"""Issue 36: no command line of the repository accepts abbreviated options (argparse
does by default: `--simulat 2` was read as `--simulate 2`, and would change meaning the
day a flag sharing the prefix is added)."""

from __future__ import annotations

import re

from tests.support import REPO

TREES = ("exporter", "generate", "benchmarks", "validation", "tests")
PARSER = re.compile(r"argparse\.ArgumentParser\(")


def _call_text(source: str, start: int) -> str:
    """The arguments of the call whose "(" ends at ``start``, to its matching ")"."""
    depth = 1
    for i in range(start, len(source)):
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        if depth == 0:
            return source[start:i]
    return source[start:]


def test_every_argument_parser_refuses_abbreviations() -> None:
    lax = []
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            source = path.read_text()
            for match in PARSER.finditer(source):
                if "allow_abbrev=False" not in _call_text(source, match.end()):
                    lax.append(str(path.relative_to(REPO)))
    # stepscope.app.args.ArgumentParser sets it for the product's commands
    assert lax == []
