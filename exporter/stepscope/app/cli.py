"""The ``stepscope`` command line.

Exit status: 0 on a clean stop, 2 for a usage or configuration problem (bad
flag, bad config or scenario file, an address no interface has, an explicitly
configured feature that cannot start, no NVIDIA driver), 1 when serving failed (the
port is taken; and when the driver was loaded after a ``--wait-for-driver`` start and
NVML still fails: a restart by the service manager is what fixes that). Errors are one
line on stderr, never a traceback; options are never abbreviated
(:mod:`stepscope.app.args`).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import errno
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from stepscope import __version__
from stepscope.app.args import EXIT_USAGE, ArgumentParser
from stepscope.app.config import Config, Listen, env_name, load, unknown_variables
from stepscope.core.errors import ConfigError

if TYPE_CHECKING:
    from stepscope.gpu.model import GpuBackend

EXIT_OK = 0
EXIT_FAILURE = 1

log = logging.getLogger("stepscope")

# Present while the NVIDIA kernel module is loaded (also inside containers: /proc/driver
# is the host kernel's).
KERNEL_DRIVER_PROC = "/proc/driver/nvidia/version"
# Back-off between tries while waiting for the driver: quick at first (a boot race is
# usually seconds), then every 15 s so a long wait costs nothing.
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 15.0


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="stepscope",
        description="Per-node Prometheus exporter for distributed deep-learning training.",
    )
    parser.add_argument("--version", action="version", version=f"stepscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the exporter",
        description="Serve GPU metrics on /metrics. Every flag can also be set in the YAML "
        "config file or as STEPSCOPE_<NAME> in the environment (flags win).",
    )

    defaults = Config()

    def opt(name: str, metavar: str, help_: str) -> None:
        key = name.replace("-", "_")
        default = getattr(defaults, key, None)
        if isinstance(default, (int, float, str, Listen)) and not isinstance(default, bool):
            shown = f"{default:g}" if isinstance(default, float) else str(default)
            if key == "ingest_mode":  # a mode reads in octal, as it is written
                shown = f"{default:04o}"
            # the default is defined once, in Config, and shown from there
            if shown and "(default" not in help_:
                help_ = f"{help_} (default {shown})"
        serve.add_argument(
            f"--{name}", dest=key, metavar=metavar, default=None, help=f"{help_} [${env_name(key)}]"
        )

    opt("config", "FILE", "YAML config file")
    opt("listen", "HOST:PORT", "address to serve on")
    opt("interval", "SECONDS", "sampling interval for activity and clocks")
    opt(
        "slow-interval",
        "SECONDS",
        "sampling interval for costly counters: energy, violation times",
    )
    opt("simulate", "N", "serve N simulated GPUs instead of real ones (anywhere, no driver)")
    opt("scenario", "FILE", "YAML scenario scripting the simulated GPUs over time")
    opt("hostname", "NAME", "the host label's value (default $NODE_NAME, else this host's name)")
    opt("host-label", "NAME", "the host label's name on every series: Hostname (dcgm-exporter "
        "before its 2026 rename) or hostname (after it)")
    opt("ingest", "URL", "training ingest socket")
    opt("ingest-mode", "MODE", "the ingest socket's mode, octal: 0660 admits the owner and "
        "the group, 0666 every local user")
    opt("ingest-group", "GROUP", "the ingest socket's group (name or gid): whose members may "
        "report (default the exporter's group)")
    opt("ingest-allow-uids", "UIDS", "only these users may report (comma-separated names or "
        "uids; default anyone who can write the socket)")
    opt("ingest-allow-gids", "GIDS", "... or senders whose effective group is one of these")
    opt("rank-expiry", "SECONDS", "forget a training rank silent this long")
    opt("mfu-window", "SECONDS", "window over which MFU is computed")
    opt("max-jobs", "N", "training jobs tracked per node; more are rejected")
    opt("max-ranks-per-job", "N", "ranks tracked per job; more are rejected")
    opt("max-label-length", "N", "longest accepted job name or GPU UUID")
    opt("max-connections", "N", "HTTP connections held at once; past it the peer holding "
        "the most gets no more")
    opt("http-request-timeout", "SECONDS",
        "close a connection that sends no complete request this long (silent or slow clients)")
    opt("web-config", "FILE", "TLS / basic auth, Prometheus exporter-toolkit format")
    opt("hpc-job-dir", "DIR", "Slurm job-to-GPU mapping directory (dcgm-exporter format); "
        "adds the hpc_job label to GPU series (default off)")
    opt("kubernetes-pod-resources", "SOCKET", "the kubelet's pod-resources socket "
        "(/var/lib/kubelet/pod-resources/kubelet.sock); adds the pod, namespace and "
        "container labels to GPU series (default off; needs stepscope[kubernetes])")
    opt("log-level", "LEVEL", "debug, info, warning or error")
    opt("log-format", "FORMAT", "text or json: one JSON object per line")
    opt(
        "wait-for-driver",
        "SECONDS",
        "no NVIDIA driver yet: retry for this long before giving up, for a service that "
        "may start before the driver is loaded (default 0: exit 2 at once)",
    )
    from stepscope.diagnose.cli import add_commands

    add_commands(sub)
    from stepscope.aws.discover import add_arguments as add_discover_arguments

    add_discover_arguments(
        sub.add_parser(
            "discover",
            help="list EC2 GPU instances as a Prometheus file_sd target file (needs boto3)",
            description="Find running EC2 instances by tag and instance type (all pages of "
            "DescribeInstances) and write them as Prometheus file_sd JSON, with instance "
            "id, type, availability zone and placement group labels.",
        )
    )
    return parser


def _error(message: str) -> None:
    print(f"stepscope: error: {message}", file=sys.stderr)


class DriverLoadedLate(RuntimeError):
    """The kernel driver appeared while we waited, yet NVML still fails: the process
    was started with a view of the devices (a service manager's device allow-list, as
    systemd's ``DeviceAllow=char-nvidia*``, resolved at start) that only a restart
    refreshes."""


def kernel_driver_loaded() -> bool:
    """Whether the NVIDIA kernel module is loaded on this host."""
    return os.path.exists(KERNEL_DRIVER_PROC)


def build_backend_waiting(
    cfg: Config,
    build: Callable[[Config], GpuBackend],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    driver_loaded: Callable[[], bool] = kernel_driver_loaded,
) -> GpuBackend:
    """``build(cfg)``, retried while it raises NoDriverError for up to
    ``cfg.wait_for_driver`` seconds (0: once). Logs the wait once, not every retry.

    Raises NoDriverError when the time is up, DriverLoadedLate when the kernel driver
    was loaded during the wait and NVML still fails.
    """
    from stepscope.gpu.model import NoDriverError

    deadline = clock() + cfg.wait_for_driver
    loaded_at_start = driver_loaded()
    delay = FIRST_RETRY_S
    waiting = False
    while True:
        try:
            backend = build(cfg)
        except NoDriverError as exc:
            remaining = deadline - clock()
            if remaining <= 0:
                raise
            if not waiting:
                waiting = True
                log.warning(
                    "no NVIDIA driver yet (%s); waiting up to %g s for it (wait_for_driver)",
                    str(exc).removeprefix("NVML unavailable: "),
                    cfg.wait_for_driver,
                )
            elif not loaded_at_start and driver_loaded():
                raise DriverLoadedLate(str(exc)) from exc
            else:
                log.debug("still no NVIDIA driver: %s", exc)
            sleep(min(delay, remaining))
            delay = min(delay * 2, MAX_RETRY_S)
            continue
        if waiting:
            log.info("NVIDIA driver found; serving")
        return backend


def serve(flags: dict[str, Any]) -> int:
    """Run the exporter until SIGTERM; returns the exit status."""
    from stepscope.app.serve import build_backend, configure_logging, run_server
    from stepscope.gpu.model import NoDriverError
    from stepscope.gpu.scenario import ScenarioError

    try:
        cfg = load(flags)
    except ConfigError as exc:
        _error(str(exc))
        return EXIT_USAGE
    configure_logging(cfg.log_level, cfg.log_format)
    for line in unknown_variables(os.environ):
        log.warning("%s", line)
    try:
        backend = build_backend_waiting(cfg, build_backend)
    except NoDriverError as exc:
        waited = f" after waiting {cfg.wait_for_driver:g} s" if cfg.wait_for_driver else ""
        _error(
            f"no NVIDIA driver/NVML found{waited}: "
            f"{str(exc).removeprefix('NVML unavailable: ')}. "
            "Run with --simulate N to serve N simulated GPUs."
        )
        return EXIT_USAGE
    except DriverLoadedLate as exc:
        _error(
            "the NVIDIA driver was loaded after the exporter started and NVML still fails "
            f"({str(exc).removeprefix('NVML unavailable: ')}); exiting 1 so the service "
            "manager restarts it with access to the new devices"
        )
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK
    except ScenarioError as exc:
        _error(str(exc))
        return EXIT_USAGE
    try:
        asyncio.run(run_server(cfg, flags, backend))
    except ConfigError as exc:
        backend.close()
        _error(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        backend.close()
        _error(_serve_failure(cfg, exc))
        # an address no interface has, or a name that resolves to none, is a bad --listen
        bad_address = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
        return EXIT_USAGE if bad_address else EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK


def _serve_failure(cfg: Config, exc: OSError) -> str:
    """One line: why the HTTP port could not be bound, and what to do."""
    where = f"cannot serve on {cfg.listen}"
    if isinstance(exc, socket.gaierror):
        return f"{where}: cannot resolve {cfg.listen.host!r} ({exc.strerror}); fix --listen"
    # asyncio's message repeats the address; the errno's text says it once
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    where = f"{where}: {why}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where}: another process listens there (a second stepscope, or "
            f"dcgm-exporter on {cfg.listen.port}?); stop it or choose another port "
            "with --listen HOST:PORT"
        )
    if exc.errno == errno.EACCES:
        return f"{where}: ports below 1024 need root; choose another with --listen HOST:PORT"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: no interface of this host has that address; fix --listen"
    return where


def _unknown_options(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``unknown option --intervall; did you mean --interval?`` for the first extra."""
    word = extras[0]
    if not word.startswith("-"):
        return f"unexpected argument {word!r}"
    name = word.split("=", 1)[0]
    known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    hint = f"; did you mean {close[0]}?" if close else f"; see {parser.prog} --help"
    return f"unknown option {name}{hint}"


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    raise KeyError(command)  # pragma: no cover - every command is a subparser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stepscope`` command."""
    parser = _parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        if args.command is None:
            parser.error(_unknown_options(parser, extras))
        # the subcommand's usage and the option it lacks, not the top-level usage
        _subparser(parser, args.command).error(_unknown_options(
            _subparser(parser, args.command), extras
        ))
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command in ("diagnose", "nccl-check"):
        from stepscope.diagnose.cli import run

        return run(args)
    if args.command == "discover":
        from stepscope.aws.discover import run as discover

        return discover(args)
    flags = {k: v for k, v in vars(args).items() if k != "command"}
    if args.command == "serve":
        return serve(flags)
    return EXIT_USAGE  # pragma: no cover - argparse rejects unknown commands
