"""YAML as stepscope reads it: strict about duplicate keys; mapping settings from text.

Every YAML file stepscope reads (the config file, the web config, mapping settings given
as environment text) goes through :func:`strict_load`: a key given twice is an error, as
Go's ``yaml.UnmarshalStrict`` (exporter-toolkit) makes it, never a silent last-one-wins.
"""

from __future__ import annotations

from typing import Any

import yaml


class StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping key given twice."""


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # a list or a mapping as a key ("? - a"): dict() would raise
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value, not a list or mapping",
                key_node.start_mark,
            ) from None  # fmt: skip
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node))


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def strict_load(text: str) -> Any:
    """``yaml.safe_load`` that raises ``yaml.YAMLError`` on a duplicate key, and on
    nesting deeper than Python's recursion limit (PyYAML's parser recurses: a file of
    a few thousand ``[`` raised ``RecursionError``, a traceback past every handler)."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply (thousands of levels)") from None


def mapping_text(value: Any) -> Any:
    """``value`` parsed as YAML when it is a string (e.g. ``STEPSCOPE_PEAK_FLOPS``),
    else unchanged; ValueError when the text is not YAML."""
    if not isinstance(value, str):
        return value
    try:
        return strict_load(value)
    except yaml.YAMLError:
        raise ValueError("expected a YAML/JSON mapping (each key once)") from None
