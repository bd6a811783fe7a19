"""Fast tests of one module or package each: no process started, no server but loopback
sockets inside the test. `python -m pytest tests/unit` runs them alone in under a minute."""
