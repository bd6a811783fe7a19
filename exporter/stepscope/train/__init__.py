"""The training SDK: ``from stepscope.train import StepReporter``.

Standard library only at import time; never imports aiohttp, prometheus_client
or pynvml. See docs/sdk.md.
"""
