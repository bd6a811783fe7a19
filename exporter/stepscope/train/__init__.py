"""The training SDK: ``from stepscope.train import StepReporter``.

Standard library only at import time; never imports torch, aiohttp,
prometheus_client, pynvml or yaml (torch is used lazily when the training script
has imported it). See docs/sdk.md.
"""

from stepscope.train.flops import transformer_flops_per_token
from stepscope.train.reporter import StepReporter

__all__ = ["StepReporter", "transformer_flops_per_token"]
