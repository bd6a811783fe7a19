"""The chart's values schema knows every ``stepscope serve`` setting: the ``config``
block of ``helm/stepscope/values.schema.json`` is written from
:data:`stepscope.app.config.SETTINGS`, with ``additionalProperties: false``, so a
misspelt key (``intervall: 5``) fails ``helm lint``/``helm install`` naming it instead
of rendering a config file the pod refuses at start (a crash loop). The rest of the
schema is written by hand; this step replaces only that block."""

from __future__ import annotations

import json
from pathlib import Path

from generate.constants import CHART_DIR, REPO
from generate.files import sync

SCHEMA = CHART_DIR / "values.schema.json"
_START = '    "config": {\n'
_END = "\n    },\n"


class SchemaLayoutError(ValueError):
    """The hand-written schema no longer has the top-level ``config`` block where
    this step looks for it."""


def config_schema() -> dict[str, object]:
    """The ``config`` value's schema: one property per setting (both spellings the
    config file accepts, ``slow_interval`` and ``slow-interval``), nothing else."""
    from stepscope.app.config import SETTINGS, env_name

    # mappings only the config file can carry; every other setting is also a flag
    file_only = {"peak_flops", "diagnosis"}
    properties: dict[str, object] = {}
    for key in SETTINGS:
        flag = "--" + key.replace("_", "-")
        properties[key] = {
            "description": "a mapping, config file only (README)"
            if key in file_only
            else f"stepscope serve {flag} (${env_name(key)})"
        }
    for key in SETTINGS:
        if "_" in key:
            properties[key.replace("_", "-")] = {"description": f"the same as {key}"}
    return {
        "type": "object",
        "description": "stepscope serve --config keys (README, Configuration); "
        "generated from stepscope.app.config by python -m generate",
        "additionalProperties": False,
        "properties": properties,
    }


def render(text: str) -> str:
    """``text`` (the schema file) with its top-level ``config`` block regenerated."""
    start = text.find(_START)
    end = text.find(_END, start)
    if start < 0 or end < 0:
        raise SchemaLayoutError(f"{SCHEMA}: no top-level \"config\": {{ ... }} block found")
    body = json.dumps(config_schema(), indent=2)
    block = '    "config": ' + body.replace("\n", "\n    ")
    return text[:start] + block + text[end + len("\n    }") :]


def write(repo: Path = REPO) -> list[str]:
    """Rewrite the schema's ``config`` block in the checkout ``repo``."""
    path = repo / SCHEMA
    return sync(repo, {SCHEMA: render(path.read_text(encoding="utf-8"))})
