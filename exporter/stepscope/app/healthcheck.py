"""``python -m stepscope.app.healthcheck``: does the exporter on this host answer?

The container image's HEALTHCHECK. It finds the port the way ``stepscope serve`` does from
the config file and ``STEPSCOPE_*`` environment (not from command-line flags, which it
cannot see), asks ``/healthz`` over HTTP, then HTTPS, on loopback, and exits 0 when the
exporter answers at all: a 401 from basic auth or a rejected client certificate still
proves it is alive. Exit 1 otherwise; 2, with one line, for a bad argument or setting
(the exporter could not have started with it either; Docker and Kubernetes count every
non-zero status as a failed check). Standard library only, and quick: it runs every 30 s
beside the exporter.
"""

from __future__ import annotations

import http.client
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

TIMEOUT_S = 4.0


def _loopback(host: str) -> str:
    # all interfaces (":9400", "0.0.0.0", "::") are reached through loopback
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def answers(url: str, timeout: float = TIMEOUT_S) -> bool:
    """Whether an HTTP(S) server answers ``url`` with any status."""
    # A liveness probe on loopback: the exporter's certificate is not what is checked.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(url, timeout=timeout):
            return True
    except urllib.error.HTTPError as err:
        err.close()
        return True
    except (OSError, ValueError, http.client.HTTPException):
        return False


PROG = "python -m stepscope.app.healthcheck"


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status for a container HEALTHCHECK: 0 alive, 1 not answering, 2 a bad
    argument or setting."""
    from stepscope.app.args import EXIT_USAGE, ArgumentParser
    from stepscope.app.config import load
    from stepscope.core.errors import ConfigError

    ArgumentParser(
        prog=PROG,
        description="Exit 0 when the stepscope exporter on this host answers /healthz "
        "(its port from the config file and STEPSCOPE_* variables), 1 when not.",
    ).parse_args(argv)
    try:
        listen = load({}).listen
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    host = _loopback(listen.host)
    for scheme in ("http", "https"):
        if answers(f"{scheme}://{host}:{listen.port}/healthz"):
            return 0
    print(f"stepscope healthcheck: nothing answers on port {listen.port}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
