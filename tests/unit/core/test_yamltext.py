"""YAML is read strictly: a duplicate key or nesting past Python's recursion limit is a
YAMLError (which the config loaders turn into one line naming the file), never a crash."""

from __future__ import annotations

import pytest
import yaml

from stepscope.core.yamltext import strict_load


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "- " * 5000 + "x", "{a: " * 3000])
def test_nesting_too_deep_is_a_yaml_error_not_a_recursion_error(text: str) -> None:
    with pytest.raises(yaml.YAMLError, match=r"nested too deeply|expected"):
        strict_load(text)


def test_a_duplicate_key_is_an_error_and_ordinary_yaml_loads() -> None:
    with pytest.raises(yaml.YAMLError):
        strict_load("a: 1\na: 2\n")
    assert strict_load("a: [1, {b: 2}]\n") == {"a": [1, {"b": 2}]}


@pytest.mark.parametrize("text", ["? - a\n: 1\n", "? {a: 1}\n: 2\n", "{[1]: x}"])
def test_a_list_or_mapping_as_a_key_is_a_yaml_error(text: str) -> None:
    # found by the web-config fuzz target: was "TypeError: unhashable type: 'list'"
    with pytest.raises(yaml.YAMLError, match="mapping key must be a plain value"):
        strict_load(text)
