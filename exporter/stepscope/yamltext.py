"""Settings that are mappings can come from the environment as YAML/JSON text."""

from __future__ import annotations

from typing import Any

import yaml


def mapping_text(value: Any) -> Any:
    """``value`` parsed as YAML when it is a string (e.g. ``STEPSCOPE_PEAK_FLOPS``),
    else unchanged; ValueError when the text is not YAML."""
    if not isinstance(value, str):
        return value
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        raise ValueError("expected a YAML/JSON mapping") from None
