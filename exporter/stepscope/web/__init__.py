"""The exporter's HTTP side, by concern (as exporter-toolkit's ``web/``).

- :mod:`~stepscope.web.app`: the aiohttp application: ``/metrics``, ``/healthz``,
  ``/readyz`` and the pages, served from the latest published snapshot;
- :mod:`~stepscope.web.guard`: the connection cap and request deadlines, and their
  ``stepscope_http_*`` counters;
- :mod:`~stepscope.web.config`: ``--web-config`` (exporter-toolkit format) parsed and
  validated into typed settings;
- :mod:`~stepscope.web.tls`: the SSLContext, the start-up handshake self-test and
  certificate reload;
- :mod:`~stepscope.web.auth`: basic auth, bcrypt in a pool of its own, with a cache;
- :mod:`~stepscope.web.limits`: the rate limit and the configured response headers.

It imports only :mod:`stepscope.core`; the application (``stepscope.app.serve``) wires it.
"""
