"""XID events against a fake NVML: drained without blocking, on the right GPU."""

from __future__ import annotations

import time

import pynvml
import pytest

from tests.support.fake_nvml import (
    FAST,
    FakeGpu,
    backend_for,
)

pytestmark = pytest.mark.usefixtures("nvml_path")  # each test through both paths



def test_xid_drain_returns_every_pending_event_on_the_right_gpu_without_blocking() -> None:
    backend, fake = backend_for(FakeGpu(), FakeGpu(), FakeGpu())
    assert fake.registered == [0, 1, 2]
    fake.pending_events.extend([(2, 79), (0, 13), (2, 48)])
    before = time.time()
    events = backend.events()
    assert [(e.index, e.xid) for e in events] == [(2, 79), (0, 13), (2, 48)]
    assert all(before <= e.timestamp <= time.time() for e in events)
    assert backend.events() == []
    assert set(fake.wait_timeouts) == {0}  # never waits


def test_gpu_without_xid_support_is_skipped_and_others_still_report() -> None:
    no_events = FakeGpu(fail={"nvmlDeviceRegisterEvents": pynvml.NVML_ERROR_NOT_SUPPORTED})
    backend, fake = backend_for(no_events, FakeGpu())
    assert fake.registered == [1]
    fake.pending_events.append((1, 31))
    assert [(e.index, e.xid) for e in backend.events()] == [(1, 31)]
    assert backend.read(0, FAST).values["gpu_util"] == 97

