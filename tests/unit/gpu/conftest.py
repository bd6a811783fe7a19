"""Fixtures of the GPU tests."""

from __future__ import annotations

import pytest

from tests.support.fake_nvml import FakeNvml


@pytest.fixture(params=["c_functions", "wrappers"])
def nvml_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test through the C function pointers and through pynvml's wrappers (a module
    of fake-NVML tests asks for it with ``pytestmark = pytest.mark.usefixtures(...)``)."""
    monkeypatch.setattr(FakeNvml, "c_functions", request.param == "c_functions")
    return str(request.param)
