"""The command line's parser: argparse with two house rules, for every command
(``stepscope`` and its subcommands, the image's healthcheck, ``python -m generate``).

- No abbreviations: argparse takes ``--simulat 2`` for ``--simulate 2`` by default, and
  such a command line changes meaning (or breaks) the day a flag sharing the prefix is
  added. Options are spelled out.
- A usage error is one line on stderr, ``PROG: error: WHAT``, and exit status 2; not the
  usage block first (a subcommand's usage runs to a dozen lines and pushes the error out of
  a service manager's one-line status). ``PROG --help`` prints the usage.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

EXIT_USAGE = 2


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with ``allow_abbrev=False`` and one-line errors. Its
    subparsers are of this class too (argparse makes them of the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE`` alone and exit 2."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")

