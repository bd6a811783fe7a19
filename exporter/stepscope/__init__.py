"""stepscope: a per-node Prometheus exporter for distributed deep-learning training."""

__version__ = "0.1.0"
