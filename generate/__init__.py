"""The repository's generated files and the one command that makes them.

    python -m generate                    # rewrite every generated file, in order
    python -m generate --check            # exit 1 naming each one that is out of date
    python -m generate --package [DIR]    # then build the chart archive (dist/)

One module per artefact: :mod:`generate.dashboards` (Grafana JSON), :mod:`generate.rules`
(the rules and rule tests for the ``hostname`` label), :mod:`generate.chart_copies` (the
chart's copies of both), :mod:`generate.manifests` (plain Kubernetes manifests rendered
from the chart), :mod:`generate.chart_package` (the chart archive);
:mod:`generate.constants` holds what they and the tests share. Not part of the wheel.
"""
