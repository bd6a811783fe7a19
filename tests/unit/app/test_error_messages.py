"""Issue 27's error messages, each one line saying what is wrong and what to do: the
command line's (help, unknown options, the ingest mode), the start-up URL, diagnose's
exporter address and the SDK's ingest URL."""

from __future__ import annotations

import pytest

from stepscope.app.cli import main
from stepscope.app.serve import served_url
from stepscope.diagnose.cli import base_url
from stepscope.train import StepReporter


def _stderr_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return int(exit_.value.code or 0), capsys.readouterr().err


def test_serve_help_shows_the_ingest_mode_in_octal(capsys: pytest.CaptureFixture[str]) -> None:
    """It showed `(default 432)`, the decimal of 0660."""
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "0666 every local user (default 0660)" in help_text
    assert "432" not in help_text


def test_a_misspelt_serve_option_names_it_and_the_one_meant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`serve --intervall 2` printed the top-level usage and `unrecognized arguments`."""
    code, err = _stderr_of(["serve", "--intervall", "2"], capsys)
    assert code == 2
    # one line (issue 36): the subcommand's usage block pushed it out of view
    assert err == "stepscope serve: error: unknown option --intervall; did you mean --interval?\n"


def test_an_abbreviated_option_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse took `--simulat 2` for `--simulate 2`: a command line that changes
    meaning the day a flag sharing the prefix is added."""
    code, err = _stderr_of(["serve", "--simulat", "2"], capsys)
    assert code == 2
    assert err == "stepscope serve: error: unknown option --simulat; did you mean --simulate?\n"


def test_an_option_nothing_resembles_points_to_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _stderr_of(["diagnose", "--colour"], capsys)
    assert code == 2
    assert err.splitlines()[-1] == (
        "stepscope diagnose: error: unknown option --colour; see stepscope diagnose --help"
    )


def test_an_ingest_mode_with_execute_bits_says_which_mode_to_use(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It said "write it as an octal string ... got '0777'" to a user who had."""
    assert main(["serve", "--ingest-mode", "0777", "--simulate", "1"]) == 2
    assert capsys.readouterr().err == (
        "stepscope: error: ingest_mode: execute bits mean nothing on a socket: use 0666 "
        "(read/write bits only; 0660 admits the owner and the group, 0666 every local user), "
        "got '0777' (from --ingest-mode)\n"
    )


@pytest.mark.parametrize(
    ("sockname", "url"),
    [
        (("::", 9400, 0, 0), "http://localhost:9400/metrics (all interfaces)"),
        (("0.0.0.0", 9400), "http://localhost:9400/metrics (all interfaces)"),
        (("::1", 9400, 0, 0), "http://[::1]:9400/metrics"),
        (("fe80::1%eth0", 9400, 0, 2), "http://[fe80::1%eth0]:9400/metrics"),
        (("10.0.0.7", 9400), "http://10.0.0.7:9400/metrics"),
    ],
)
def test_the_start_up_line_prints_a_url_that_works(
    sockname: tuple[object, ...], url: str
) -> None:
    """It printed `http://:::9400/metrics` for the default `--listen :9400`."""
    assert served_url("http", [sockname], ":9400") == url


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("localhost:9400", "http://localhost:9400"),
        (":9400", "http://127.0.0.1:9400"),
        ("https://node-1:9400", "https://node-1:9400"),
        ("http://[::1]:9400/", "http://[::1]:9400/"),
    ],
)
def test_diagnose_takes_host_port_as_http(given: str, url: str) -> None:
    """`diagnose --exporter localhost:9400` said "unknown url type: localhost"."""
    assert base_url(given, "--exporter") == url


def test_diagnose_refuses_another_scheme_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--exporter", "ftp://node-1:9400"]) == 2
    assert capsys.readouterr().err == (
        "stepscope: error: --exporter: expected http://HOST:PORT, https://HOST:PORT or "
        "HOST:PORT, got 'ftp://node-1:9400'\n"
    )


def test_a_bad_stepscope_ingest_is_named_by_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's error named `ingest`, not the variable the job had set."""
    monkeypatch.setenv("STEPSCOPE_INGEST", "tcp://127.0.0.1:9401")
    with pytest.raises(ValueError) as err:
        StepReporter(job="j")
    assert str(err.value) == (
        "stepscope: STEPSCOPE_INGEST='tcp://127.0.0.1:9401': expected unix:///PATH or "
        "udp://HOST:PORT (the scheme must be unix:// or udp://); fix or unset "
        "STEPSCOPE_INGEST (it must name the exporter's --ingest)"
    )


def test_a_bad_ingest_argument_is_named_as_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPSCOPE_INGEST", "unix:///run/stepscope/ingest.sock")
    with pytest.raises(ValueError, match=r"^stepscope: ingest='x': .*pass the exporter's"):
        StepReporter(job="j", ingest="x")
