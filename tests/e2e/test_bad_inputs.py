"""Every command line turns bad input into one line naming it and exit status 2 (issue
36: `diagnose --prometheus 'not a url'` printed a 42-line traceback and exited 1, the
status that means "bottleneck found"). Each row runs the real command, as a user would,
and fails on a traceback, a second line or another status.

The commands: ``stepscope serve``, ``diagnose``, ``nccl-check``, ``discover``, the
image's healthcheck and ``python -m generate``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import REPO, start_exporter

STEPSCOPE = [sys.executable, "-m", "stepscope"]
HEALTHCHECK = [sys.executable, "-m", "stepscope.app.healthcheck"]
GENERATE = [sys.executable, "-m", "generate"]
# serve rows that get past the settings: never the machine's default socket or port 9400
SERVE = [*STEPSCOPE, "serve", "--listen", "127.0.0.1:0", "--ingest", "udp://127.0.0.1:9"]

# (argv, extra environment, a fragment the one line must hold: the input it names)
Row = tuple[list[str], dict[str, str], str]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Path:
    """Bad files of each kind, and a folder of modules that hide an installed extra."""
    d = tmp_path_factory.mktemp("bad-inputs")
    (d / "bad.yaml").write_text("interval: [1\n")
    (d / "unknown-key.yaml").write_text("intervall: 2\n")
    (d / "a-file").write_text("")
    (d / "cert.der").write_bytes(b"0\x82\x01\x00not pem")
    (d / "der-cert.yml").write_text(
        f"tls_server_config:\n  cert_file: cert.der\n  key_file: {certs}/server.key\n"
    )
    (d / "cert-as-key.yml").write_text(
        f"tls_server_config:\n  cert_file: {certs}/server.crt\n  key_file: {certs}/server.crt\n"
    )
    (d / "users.yml").write_text(
        "basic_auth_users:\n  prometheus: "
        "$2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG\n"
    )
    hidden = d / "hidden"
    for module in ("grpc", "bcrypt"):
        (hidden / module).mkdir(parents=True)
        (hidden / module / "__init__.py").write_text(
            f"raise ImportError('{module} hidden by the test')\n"
        )
    return d


def _without(files: Path) -> dict[str, str]:
    """The environment of a machine where grpcio and bcrypt are not installed."""
    return {
        "PYTHONPATH": os.pathsep.join(
            [str(files / "hidden"), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    }


def rows(files: Path) -> Iterator[tuple[str, Row]]:
    f = str(files)
    # ---- serve: flags, the environment, the config file, files it names, features
    yield "serve-interval", ([*SERVE, "--interval", "abc"], {}, "interval")
    yield "serve-abbreviation", ([*SERVE, "--simulat", "2"], {}, "--simulat")
    yield "serve-argument", ([*SERVE, "now"], {}, "'now'")
    yield "serve-listen", ([*STEPSCOPE, "serve", "--listen", "9400"], {}, "listen")
    yield (
        "serve-listen-host",
        (
            [
                *STEPSCOPE,
                "serve",
                "--simulate",
                "1",
                "--ingest",
                "udp://127.0.0.1:9",
                "--listen",
                "no-such-host.invalid:0",
            ],
            {},
            "no-such-host.invalid",
        ),
    )
    yield "serve-env", ([*SERVE], {"STEPSCOPE_SLOW_INTERVAL": "-5"}, "$STEPSCOPE_SLOW_INTERVAL")
    yield "serve-config-missing", ([*SERVE, "--config", f"{f}/none.yaml"], {}, "none.yaml")
    yield "serve-config-yaml", ([*SERVE, "--config", f"{f}/bad.yaml"], {}, "bad.yaml")
    yield "serve-config-key", ([*SERVE, "--config", f"{f}/unknown-key.yaml"], {}, "intervall")
    yield "serve-simulate", ([*SERVE, "--simulate", "0"], {}, "simulate")
    yield "serve-scenario", ([*SERVE, "--scenario", f"{f}/bad.yaml"], {}, "bad.yaml")
    yield "serve-log-level", ([*SERVE, "--log-level", "loud"], {}, "log_level")
    yield "serve-ingest-url", ([*SERVE, "--ingest", "tcp://127.0.0.1:9"], {}, "ingest")
    yield (
        "serve-ingest-group",
        ([*SERVE, "--ingest-group", "no-such-group-x"], {}, "no-such-group-x"),
    )
    yield (
        "serve-ingest-unbindable",
        (
            [*SERVE, "--simulate", "1", "--ingest", "unix:///proc/stepscope/ingest.sock"],
            {},
            "/proc/stepscope",
        ),
    )
    yield (
        "serve-web-config-missing",
        ([*SERVE, "--simulate", "1", "--web-config", f"{f}/none.yml"], {}, "none.yml"),
    )
    yield (
        "serve-der-certificate",
        (
            [*SERVE, "--simulate", "1", "--web-config", f"{f}/der-cert.yml"],
            {},
            "cert.der is not PEM",
        ),
    )
    yield (
        "serve-cert-as-key",
        (
            [*SERVE, "--simulate", "1", "--web-config", f"{f}/cert-as-key.yml"],
            {},
            "holds no PEM private key",
        ),
    )
    yield (
        "serve-auth-without-bcrypt",
        ([*SERVE, "--simulate", "1", "--web-config", f"{f}/users.yml"], _without(files), "bcrypt"),
    )
    yield (
        "serve-pods-without-grpc",
        (
            [*SERVE, "--simulate", "1", "--kubernetes-pod-resources", f"{f}/kubelet.sock"],
            _without(files),
            "kubernetes_pod_resources",
        ),
    )
    # ---- diagnose
    yield (
        "diagnose-prometheus-url",
        ([*STEPSCOPE, "diagnose", "--prometheus", "not a url"], {}, "--prometheus"),
    )
    yield (
        "diagnose-exporter-space",
        ([*STEPSCOPE, "diagnose", "--exporter", "my host:9400"], {}, "--exporter"),
    )
    yield (
        "diagnose-exporter-port",
        ([*STEPSCOPE, "diagnose", "--exporter", "localhost:99999"], {}, "--exporter"),
    )
    yield "diagnose-timeout", ([*STEPSCOPE, "diagnose", "--timeout", "-1"], {}, "--timeout")
    yield "diagnose-timeout-nan", ([*STEPSCOPE, "diagnose", "--timeout", "nan"], {}, "--timeout")
    yield "diagnose-timeout-word", ([*STEPSCOPE, "diagnose", "--timeout", "soon"], {}, "--timeout")
    yield "diagnose-abbreviation", ([*STEPSCOPE, "diagnose", "--js"], {}, "--js")
    yield "diagnose-since-alone", ([*STEPSCOPE, "diagnose", "--since", "1d"], {}, "--since")
    yield (
        "diagnose-since",
        (
            [
                *STEPSCOPE,
                "diagnose",
                "--prometheus",
                "localhost:9",
                "--job",
                "j",
                "--since",
                "soon",
            ],
            {},
            "--since",
        ),
    )
    yield (
        "diagnose-host-label",
        ([*STEPSCOPE, "diagnose", "--host-label", "host"], {}, "--host-label"),
    )
    # ---- nccl-check
    yield "nccl-check-none", ([*STEPSCOPE, "nccl-check"], {}, "LOGFILE")
    yield "nccl-check-missing", ([*STEPSCOPE, "nccl-check", f"{f}/none.log"], {}, "none.log")
    yield "nccl-check-folder", ([*STEPSCOPE, "nccl-check", f], {}, f)
    # ---- discover (rejected before any AWS call)
    yield "discover-port", ([*STEPSCOPE, "discover", "--port", "0"], {}, "--port")
    yield "discover-port-word", ([*STEPSCOPE, "discover", "--port", "http"], {}, "--port")
    yield "discover-tag", ([*STEPSCOPE, "discover", "--tag", "=gpu"], {}, "--tag")
    yield "discover-page-size", ([*STEPSCOPE, "discover", "--page-size", "1"], {}, "--page-size")
    yield "discover-address", ([*STEPSCOPE, "discover", "--address", "elastic"], {}, "--address")
    yield (
        "discover-output",
        ([*STEPSCOPE, "discover", "--output", f"{f}/a-file/sd.json"], {}, "--output"),
    )
    yield (
        "discover-endpoint",
        (
            [*STEPSCOPE, "discover", "--region", "us-east-1", "--endpoint-url", "not a url"],
            {},
            "--endpoint-url",
        ),
    )
    # ---- the image's healthcheck
    yield "healthcheck-argument", ([*HEALTHCHECK, "--port", "9400"], {}, "--port")
    yield "healthcheck-env", ([*HEALTHCHECK], {"STEPSCOPE_LISTEN": "nowhere"}, "listen")
    # ---- python -m generate
    yield "generate-option", ([*GENERATE, "--chek"], {}, "--chek")
    yield "generate-abbreviation", ([*GENERATE, "--che"], {}, "--che")
    yield "generate-package", ([*GENERATE, "--package", f"{f}/a-file/dist"], {}, "--package")


def _problem(name: str, row: Row) -> str | None:
    """What is wrong with the command's answer to one bad input, or None."""
    argv, env, named = row
    full_env = {**os.environ, **env}
    full_env.pop("STEPSCOPE_CONFIG", None)
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    one_line = done.stderr.count("\n") == 1 and " error: " in done.stderr
    if "Traceback" in done.stderr or done.returncode != 2 or not one_line:
        return f"{name}: exit {done.returncode}: {done.stderr!r}"
    if named not in done.stderr:
        return f"{name}: does not name {named!r}: {done.stderr!r}"
    return None


def test_every_bad_input_is_one_line_naming_it_and_exit_2(files: Path) -> None:
    """The rows run four at a time (each is a fresh interpreter, mostly start-up)."""
    table = dict(rows(files))
    with ThreadPoolExecutor(max_workers=4) as pool:
        problems = [p for p in pool.map(_problem, table, table.values()) if p]
    assert len(table) >= 45
    assert problems == []


def test_diagnose_pointed_at_an_exporter_says_it_is_not_a_prometheus() -> None:
    """It said only "Not Found"."""
    exp = start_exporter(["--simulate", "1", "--ingest", "udp://127.0.0.1:9"])
    try:
        done = subprocess.run(
            [*STEPSCOPE, "diagnose", "--prometheus", exp.address],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        assert exp.stop() == 0
    assert done.returncode == 2
    assert done.stderr == (
        f"stepscope: error: cannot query http://{exp.address}: /api/v1/query answered "
        "HTTP 404 Not Found (is it a Prometheus server?)\n"
    )


def test_a_misspelt_variable_is_warned_with_the_setting_meant() -> None:
    """A STEPSCOPE_INTERVL was ignored without a word."""
    done = subprocess.run(
        [
            *STEPSCOPE,
            "serve",
            "--simulate",
            "1",
            "--listen",
            "no-such-host.invalid:0",
            "--ingest",
            "udp://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "STEPSCOPE_INTERVL": "2"},
    )
    warning, error = done.stderr.splitlines()
    assert warning.endswith(
        "WARNING stepscope: STEPSCOPE_INTERVL is not a setting and is ignored; did you mean "
        "STEPSCOPE_INTERVAL?"
    )
    assert error.startswith("stepscope: error: cannot serve on no-such-host.invalid:0")
