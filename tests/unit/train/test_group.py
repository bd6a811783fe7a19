"""A rank's group of peers (a pipeline stage, a role): from the argument, the environment
or Megatron's pipeline stage, sent once in the datagram's constant part, parsed and kept
by the exporter as a fixed label of the rank's series."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from stepscope.core.labels import LabelSchema
from stepscope.ingest.aggregate import Aggregator
from stepscope.shared import datagram as schema
from stepscope.shared.datagram import Limits, Rejection, StepRecord, parse_datagram
from stepscope.train import StepReporter
from stepscope.train._env import GROUP_ENV

MEGATRON = "megatron.core.parallel_state"


@pytest.fixture
def ingest(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[socket.socket, str]]:
    monkeypatch.delenv(GROUP_ENV, raising=False)
    monkeypatch.delitem(sys.modules, MEGATRON, raising=False)
    path = tempfile.mkdtemp(prefix="ss-")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(os.path.join(path, "i.sock"))
    sock.settimeout(10)
    yield sock, f"unix://{path}/i.sock"
    sock.close()
    shutil.rmtree(path, ignore_errors=True)


def one_step(url: str, **kwargs: Any) -> tuple[StepReporter, str]:
    rep = StepReporter("pp", ingest=url, rank=2, world_size=4, **kwargs)
    with rep.step():
        pass
    return rep, url


def received(sock: socket.socket) -> bytes:
    return sock.recv(schema.MAX_DATAGRAM_BYTES + 1)


def test_the_group_argument_rides_in_every_datagram_and_becomes_a_label(
    ingest: tuple[socket.socket, str],
) -> None:
    sock, url = ingest
    rep, _ = one_step(url, group="stage1", warmup_steps=0)
    raw = received(sock)
    rep.close()
    assert json.loads(raw)["group"] == "stage1"
    rec = parse_datagram(raw, Limits())
    assert isinstance(rec, StepRecord) and rec.group == "stage1"
    agg = Aggregator()
    assert agg.add(rec) is None
    (view,) = agg.view().ranks
    labels = LabelSchema("node-a", (), {}, (), {}).rank(view.identity)
    assert labels == '{training_job="pp",rank="2",local_rank="0",group="stage1",Hostname="node-a"}'
    # the group is identity: a datagram of the same rank naming another is refused
    other = parse_datagram(raw.replace(b'"group":"stage1"', b'"group":"stage2"'), Limits())
    assert isinstance(other, StepRecord)
    assert agg.add(other._replace(step=1)) == "identity_changed"


def test_no_group_means_no_label_and_no_field(ingest: tuple[socket.socket, str]) -> None:
    sock, url = ingest
    rep, _ = one_step(url)
    raw = received(sock)
    rep.close()
    assert "group" not in json.loads(raw) and rep.group is None
    rec = parse_datagram(raw, Limits())
    assert isinstance(rec, StepRecord) and rec.group is None
    assert "group" not in LabelSchema("n", (), {}, (), {}).subject("pp", 2, 0, None, rec.group)


def test_the_group_comes_from_the_environment_then_megatron(
    ingest: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    sock, url = ingest
    monkeypatch.setenv(GROUP_ENV, "critic")
    rep, _ = one_step(url)
    assert rep.group == "critic" and json.loads(received(sock))["group"] == "critic"
    rep.close()
    # Megatron imported with its pipeline initialized: the rank's stage
    state = types.ModuleType(MEGATRON)
    state.model_parallel_is_initialized = lambda: True  # type: ignore[attr-defined]
    state.get_pipeline_model_parallel_world_size = lambda: 4  # type: ignore[attr-defined]
    state.get_pipeline_model_parallel_rank = lambda: 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MEGATRON, state)
    monkeypatch.setenv(GROUP_ENV, "bad group!")  # ignored, logged: Megatron's then
    rep, _ = one_step(url)
    assert rep.group == "stage3" and json.loads(received(sock))["group"] == "stage3"
    rep.close()
    assert "ignoring STEPSCOPE_GROUP='bad group!'" in caplog.text
    # the argument wins; one pipeline stage, or an API that fails, is no group
    assert StepReporter("j", ingest=url, group="stage0").group == "stage0"
    monkeypatch.delenv(GROUP_ENV)
    state.get_pipeline_model_parallel_world_size = lambda: 1  # type: ignore[attr-defined]
    assert StepReporter("j", ingest=url).group is None

    def broken() -> bool:
        raise RuntimeError("not this version's API")

    state.model_parallel_is_initialized = broken  # type: ignore[attr-defined]
    assert StepReporter("j", ingest=url).group is None


@pytest.mark.parametrize("bad", ["", "two words", "x" * 65, "stage\n0", 3])
def test_a_bad_group_argument_is_refused_at_construction(bad: object) -> None:
    with pytest.raises(ValueError, match=r"group .* is not label-safe"):
        StepReporter("j", ingest="unix:///nonexistent/s", group=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "reason"), [
    ('"stage 0"', "bad_label"), ('"' + "x" * 65 + '"', "bad_label"), ("3", "wrong_type"),
    ("null", "wrong_type"),
])  # fmt: skip
def test_the_exporter_refuses_a_group_that_is_no_label_value(value: str, reason: str) -> None:
    raw = (f'{{"v":1,"type":"step","job":"j","rank":0,"local_rank":0,"step":0,'
           f'"t":{time.time()},"dur":0.5,"group":{value}}}').encode()  # fmt: skip
    got = parse_datagram(raw, Limits())
    assert isinstance(got, Rejection) and got.reason == reason
