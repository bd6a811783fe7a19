"""Fuzz target: the web config's parser (YAML read strictly, then validated).

Any bytes in the file ``--web-config`` names: a ``ConfigError`` that names what is wrong
(the exporter prints it in one line and exits 2), or a config; never another exception.
The target reads no file the config names (``parse_web_config`` reads none;
``load_web_config``'s certificate loading is tested on real files elsewhere).
"""

from __future__ import annotations

from pathlib import Path

import atheris
import yaml

with atheris.instrument_imports(include=["stepscope"]):
    from stepscope.core.errors import ConfigError
    from stepscope.core.yamltext import strict_load
    from stepscope.web.config import parse_web_config

from tests.security.fuzz._harness import fuzz

BASE = Path("/nonexistent-stepscope-fuzz")


def one_input(data: bytes) -> None:
    try:
        document = strict_load(data.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return  # load_web_config turns these into a ConfigError naming the file
    try:
        parse_web_config(document, BASE)
    except ConfigError as exc:
        assert str(exc).startswith("web_config"), exc


if __name__ == "__main__":
    fuzz(one_input)
