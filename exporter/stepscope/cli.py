"""The ``stepscope`` command line.

Exit status: 0 on a clean stop, 2 for a usage or configuration problem (bad
flag, bad config or scenario file, no NVIDIA driver), 1 when serving failed.
Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from stepscope import __version__
from stepscope.config import ConfigError, env_name, load

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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

    def opt(name: str, metavar: str, help_: str) -> None:
        key = name.replace("-", "_")
        serve.add_argument(
            f"--{name}", dest=key, metavar=metavar, default=None, help=f"{help_} [${env_name(key)}]"
        )

    opt("config", "FILE", "YAML config file")
    opt("listen", "HOST:PORT", "address to serve on (default :9400)")
    opt("interval", "SECONDS", "sampling interval for activity and clocks (default 1)")
    opt(
        "slow-interval",
        "SECONDS",
        "sampling interval for costly counters: energy, violation times (default 10)",
    )
    opt("simulate", "N", "serve N simulated GPUs instead of real ones (anywhere, no driver)")
    opt("scenario", "FILE", "YAML scenario scripting the simulated GPUs over time")
    opt("hostname", "NAME", "Hostname label (default $NODE_NAME, else this host's name)")
    opt("ingest", "URL", "training ingest socket (default unix:///run/stepscope/ingest.sock)")
    opt("rank-expiry", "SECONDS", "forget a training rank silent this long (default 300)")
    opt("mfu-window", "SECONDS", "window over which MFU is computed (default 30)")
    opt("max-jobs", "N", "training jobs tracked per node; more are rejected (default 8)")
    opt("max-ranks-per-job", "N", "ranks tracked per job; more are rejected (default 64)")
    opt("max-label-length", "N", "longest accepted job name or GPU UUID (default 128)")
    opt("web-config", "FILE", "TLS / basic auth, Prometheus exporter-toolkit format")
    opt("hpc-job-dir", "DIR", "Slurm job-to-GPU mapping directory (dcgm-exporter format); "
        "adds the hpc_job label to GPU series (default off)")
    opt("log-level", "LEVEL", "debug, info, warning or error (default info)")
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


def serve(flags: dict[str, Any]) -> int:
    """Run the exporter until SIGTERM; returns the exit status."""
    from stepscope.gpu.model import NoDriverError
    from stepscope.gpu.scenario import ScenarioError
    from stepscope.serve import build_backend, configure_logging, run_server

    try:
        cfg = load(flags)
    except ConfigError as exc:
        _error(str(exc))
        return EXIT_USAGE
    configure_logging(cfg.log_level)
    try:
        backend = build_backend(cfg)
    except NoDriverError as exc:
        _error(
            f"no NVIDIA driver/NVML found: {str(exc).removeprefix('NVML unavailable: ')}. "
            "Run with --simulate N to serve N simulated GPUs."
        )
        return EXIT_USAGE
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
        _error(f"cannot serve on {cfg.listen}: {exc.strerror or exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stepscope`` command."""
    parser = _parser()
    args = parser.parse_args(argv)
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
