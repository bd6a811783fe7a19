"""Issue 36: no command line of the repository accepts abbreviated options (argparse
does by default: `--simulat 2` was read as `--simulate 2`, and would change meaning the
day a flag sharing the prefix is added)."""

from __future__ import annotations

import re

from tests.support import REPO

TREES = ("exporter", "generate", "benchmarks", "validation", "tests")
PARSER = re.compile(r"argparse\.ArgumentParser\(([^)]*)")


def test_every_argument_parser_refuses_abbreviations() -> None:
    lax = []
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            for match in PARSER.finditer(path.read_text()):
                if "allow_abbrev=False" not in match.group(1):
                    lax.append(str(path.relative_to(REPO)))
    # stepscope.app.args.ArgumentParser sets it for the product's commands
    assert lax == []
