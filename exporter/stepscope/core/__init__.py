"""The exporter's core: the source registry, the label schema, the Snapshot and
rendering (serving it is :mod:`stepscope.web`'s). Nothing here imports a domain package
(``gpu``, ``ingest``, ``host``, ``net``, ``aws``, ``attribution``, ``diagnose``); they
import the core and plug into it (``tests/repo/test_layering.py`` keeps it so).
docs/architecture.md draws the flow.
"""
