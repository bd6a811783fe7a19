"""End-to-end tests: a real `stepscope serve` process, real Prometheus, torch ranks."""
