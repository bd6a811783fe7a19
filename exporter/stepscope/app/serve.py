"""``stepscope serve``: wire the backend, the sampler and the web server together.

Lifecycle: build the backend (NVML, or simulated when asked), bind the HTTP port (a
port in use ends the start here, before anything says it is serving), bind the
training ingest (the default socket may fail with a warning; one configured explicitly
must bind, or the start ends), take the first snapshot
before accepting connections so the first scrape is never empty, serve until
SIGTERM/SIGINT, reload the config file on SIGHUP.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from collections.abc import Callable
from typing import Any

from aiohttp import web

from stepscope.app.config import Config, load
from stepscope.app.logformat import log_formatter
from stepscope.app.sources import Sources, build_sources
from stepscope.core import memory
from stepscope.core.errors import ConfigError
from stepscope.core.sampler import Sampler, SamplerSettings
from stepscope.diagnose.api import diagnosis_json
from stepscope.diagnose.page import status_page_html
from stepscope.gpu.model import GpuBackend
from stepscope.ingest.aggregate import Aggregator, TrainingSettings
from stepscope.ingest.listener import IngestAccess, IngestListener
from stepscope.ingest.peak_flops import DATASHEET_PEAKS
from stepscope.ingest.refusals import process_exited, process_stamp
from stepscope.shared.datagram import Limits
from stepscope.web.app import Page, make_app
from stepscope.web.config import load_web_config
from stepscope.web.guard import (
    ConnectionGuard,
    defer_accept,
    listen_backlog,
    raise_file_limit,
)

log = logging.getLogger("stepscope")


def build_backend(cfg: Config) -> GpuBackend:
    """The GPU backend the config asks for.

    Raises NoDriverError (no NVML) or ScenarioError (bad scenario file); never
    falls back to simulated GPUs on its own.
    """
    if cfg.simulated:
        from stepscope.gpu.simulated import SimulatedBackend, default_scenario, load_scenario

        if cfg.scenario is not None:
            scenario = load_scenario(cfg.scenario, n_gpus=cfg.simulate)
        else:
            scenario = default_scenario(cfg.simulate or 1)
        return SimulatedBackend(scenario, hostname=cfg.hostname)
    from stepscope.gpu.nvml_backend import NvmlBackend

    return NvmlBackend()


# aiohttp closes a connection idle this long after a response (Prometheus re-uses its
# connection every scrape interval, at most a few minutes)
KEEPALIVE_S = 75.0

# The routes the diagnosis adds to the core's /metrics, /healthz and /readyz.
PAGES = {
    "/": Page("text/html; charset=utf-8", status_page_html),
    "/api/v1/diagnosis": Page("application/json; charset=utf-8", diagnosis_json),
}


def settings_of(cfg: Config) -> SamplerSettings:
    return SamplerSettings(cfg.hostname, cfg.interval, cfg.slow_interval, cfg.host_label)


def training_settings_of(cfg: Config) -> TrainingSettings:
    return TrainingSettings(
        limits=Limits(cfg.max_jobs, cfg.max_ranks_per_job, cfg.max_label_length),
        mfu_window=cfg.mfu_window,
        rank_expiry=cfg.rank_expiry,
        peak_flops=(
            DATASHEET_PEAKS.with_overrides(cfg.peak_flops) if cfg.peak_flops else DATASHEET_PEAKS
        ),
        allow_uids=cfg.ingest_allow_uids,
        allow_gids=cfg.ingest_allow_gids,
    )


def configure_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(log_formatter(log_format))
    logging.basicConfig(handlers=[handler])
    logging.getLogger("stepscope").setLevel(level.upper())


def reload_config(
    current: Config,
    flags: dict[str, Any],
    sampler: Sampler,
    aggregator: Aggregator,
    sources: Sources,
) -> Config:
    """Re-read file and environment; apply what can change live, keep the rest.

    A bad file on reload is logged and ignored: the running exporter keeps its
    last good configuration rather than dying.
    """
    try:
        new = load(flags)
    except ConfigError as exc:
        log.error("reload failed, keeping the running configuration: %s", exc)
        return current
    pending = [key for key in RESTART_KEYS if getattr(new, key) != getattr(current, key)]
    if (new.hpc_job_dir is None) != (sources.hpc_jobs is None):
        pending.append("hpc_job_dir")  # turned on or off
    elif sources.hpc_jobs is not None and new.hpc_job_dir is not None:
        sources.hpc_jobs.directory = new.hpc_job_dir
    sampler.update(settings_of(new))
    aggregator.update(training_settings_of(new))
    sources.diagnosis.thresholds = new.diagnosis
    logging.getLogger("stepscope").setLevel(new.log_level.upper())
    summary = f"interval {new.interval:g} s, slow interval {new.slow_interval:g} s, " + (
        f"hostname {new.hostname}"
    )
    if pending:
        # one line that cannot be read as "all applied"
        log.warning(
            "configuration reloaded except %s: changed, but applied only by a restart "
            "(systemctl restart stepscope, or restart the pod); still running with %s (%s)",
            ", ".join(pending),
            "; ".join(f"{key} {getattr(current, key)}" for key in pending if key in RESTART_KEYS)
            or "the old value",
            summary,
        )
        # the running process keeps these: the next reload compares against them
        new = _keep(new, current, pending)
    else:
        log.info("configuration reloaded (%s)", summary)
    return new


# Settings a running exporter cannot change (a bound port, an open socket, a loaded
# backend): a reload that changes one says it needs a restart.
RESTART_KEYS = (
    "listen",
    "simulate",
    "scenario",
    "web_config",
    "ingest",
    "ingest_group",
    "ingest_mode",
    "kubernetes_pod_resources",
)


def _keep(new: Config, current: Config, keys: list[str]) -> Config:
    import dataclasses

    kept = {k: getattr(current, k) for k in keys if k in RESTART_KEYS}
    return dataclasses.replace(new, **kept)


def check_optional_features(cfg: Config) -> None:
    """ConfigError for an optional feature configured explicitly that cannot start: its
    extra is not installed. (Basic auth without bcrypt is refused with the web config.)"""
    if cfg.kubernetes_pod_resources is not None:
        from stepscope.attribution.kubernetes import KubeletUnavailable, check_extra

        try:
            check_extra()
        except KubeletUnavailable as exc:
            raise ConfigError(f"kubernetes_pod_resources: {exc}") from None


def served_url(scheme: str, sockets: list[tuple[Any, ...]], listen: str) -> str:
    """A URL a user can paste for the start-up line: IPv6 in brackets, and for all
    interfaces (``0.0.0.0``, ``::``) ``localhost``, which reaches them from this host."""
    if not sockets:
        return f"{scheme}://{listen}/metrics"
    host, port = str(sockets[0][0]), int(sockets[0][1])
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and address.is_unspecified:
        return f"{scheme}://localhost:{port}/metrics (all interfaces)"
    shown = f"[{host}]" if address is not None and address.version == 6 else host
    return f"{scheme}://{shown}:{port}/metrics"


async def run_server(
    cfg: Config,
    flags: dict[str, Any],
    backend: GpuBackend,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. ``ready`` gets the bound address (tests, logs)."""
    memory.tune()  # before the sampler's and the web server's threads allocate
    check_optional_features(cfg)
    web_cfg = load_web_config(cfg.web_config) if cfg.web_config else None
    auth = web_cfg.basic_auth() if web_cfg else None
    raise_file_limit(cfg.max_connections)
    loop = asyncio.get_running_loop()
    # bind first: a port in use ends the start before the ingest or a log line says
    # anything is served; connections are accepted once the first snapshot is taken
    protocol: list[Callable[[], asyncio.Protocol]] = []
    server = await loop.create_server(
        lambda: protocol[0](),
        cfg.listen.host or None,
        cfg.listen.port,
        ssl=web_cfg.ssl_context() if web_cfg else None,
        # a TLS connection reaches the guard once its handshake is done: until then the
        # request timeout bounds it here (asyncio's default is 60 s)
        ssl_handshake_timeout=cfg.http_request_timeout if web_cfg and web_cfg.tls else None,
        reuse_address=True,
        backlog=listen_backlog(),
        start_serving=False,
    )
    for sock in server.sockets:
        defer_accept(sock, cfg.http_request_timeout)
    aggregator = Aggregator(
        training_settings_of(cfg), process_exited=process_exited, process_stamp=process_stamp,
    )
    ingest = IngestListener(
        cfg.ingest, aggregator, IngestAccess(mode=cfg.ingest_mode, group=cfg.ingest_group)
    )
    # the default socket may degrade (logged once, stepscope_ingest_up 0); one configured
    # explicitly that cannot be bound stops the start
    ingest.start(required="ingest" in cfg.explicit)
    guard = ConnectionGuard(cfg.max_connections, cfg.http_request_timeout, KEEPALIVE_S)
    sources = build_sources(cfg, backend, aggregator, guard, auth)
    sampler = Sampler(
        sources.registry,
        settings_of(cfg),
        build_labels={"backend": backend.name},
        manage_gc=True,
    )
    await asyncio.to_thread(sampler.sample_once)  # first scrape is never empty
    sampler.start()
    app = make_app(
        sampler,
        middlewares=(guard.middleware, *(web_cfg.middlewares(auth) if web_cfg else ())),
        pages=PAGES,
    )
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, keepalive_timeout=KEEPALIVE_S
    )
    await runner.setup()
    stop = asyncio.Event()
    current = cfg

    def on_hup() -> None:
        nonlocal current
        current = reload_config(current, flags, sampler, aggregator, sources)

    try:
        # our own server (not TCPSite): the guard caps and times out connections
        protocol.append(guard.wrap(runner.server))  # type: ignore[arg-type]
        await server.start_serving()
        guard.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, on_hup)
        addrs = [sock.getsockname() for sock in server.sockets]
        bound = f"{addrs[0][0]}:{addrs[0][1]}" if addrs else str(cfg.listen)
        scheme = "https" if web_cfg and web_cfg.tls else "http"
        log.info(
            "serving %d GPU(s) (%s backend) on %s",
            len(backend.devices()),
            backend.name,
            served_url(scheme, addrs, str(cfg.listen)),
        )
        if ready is not None:
            ready(bound)
        await stop.wait()
        log.info("stopping")
    finally:
        ingest.close()
        guard.stop()
        server.close()
        await runner.cleanup()
        await asyncio.to_thread(sampler.stop)
