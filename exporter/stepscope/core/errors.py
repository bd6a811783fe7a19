"""The one error a bad setting raises, wherever it is read (the exporter's config, the web
config, the diagnosis thresholds): its message names the key, the value and the source."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is missing, malformed or out of range; the message names it."""
