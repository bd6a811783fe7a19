"""The compatibility layer over pynvml: the error policy, pynvml's own codes (with
nvml.h's defaults on an old pynvml) and the decoding of field values."""

from __future__ import annotations

import importlib.util
import sys
import types

import pynvml
import pytest

from stepscope.gpu import pynvml_compat
from stepscope.gpu.pynvml_compat import Failure, classify
from tests.support.fake_nvml import nvml_error


@pytest.mark.parametrize(
    ("code", "failure", "per_value"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, Failure.UNSUPPORTED, Failure.UNSUPPORTED),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, Failure.UNSUPPORTED, Failure.UNSUPPORTED),
        (pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, Failure.UNSUPPORTED, Failure.UNSUPPORTED),
        (pynvml.NVML_ERROR_DEPRECATED, Failure.UNSUPPORTED, Failure.UNSUPPORTED),
        # a field id this driver does not know: only inside a batch does it mean that
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, Failure.ERROR, Failure.UNSUPPORTED),
        (pynvml.NVML_ERROR_GPU_IS_LOST, Failure.GPU_LOST, Failure.GPU_LOST),
        (pynvml.NVML_ERROR_GPU_NOT_FOUND, Failure.GPU_LOST, Failure.GPU_LOST),
        (pynvml.NVML_ERROR_RESET_REQUIRED, Failure.GPU_LOST, Failure.GPU_LOST),
        (pynvml.NVML_ERROR_UNINITIALIZED, Failure.GPU_LOST, Failure.GPU_LOST),
        (pynvml.NVML_ERROR_UNKNOWN, Failure.UNKNOWN, Failure.UNKNOWN),
        (pynvml.NVML_ERROR_TIMEOUT, Failure.ERROR, Failure.ERROR),
        (pynvml.NVML_ERROR_NO_PERMISSION, Failure.ERROR, Failure.ERROR),
        (pynvml.NVML_ERROR_NO_DATA, Failure.ERROR, Failure.ERROR),
        (-1, Failure.ERROR, Failure.ERROR),  # an exception that is not an NVML error
    ],
)
def test_error_policy_says_what_each_nvml_error_means(
    code: int, failure: Failure, per_value: Failure,
) -> None:
    assert classify(code) is failure
    assert classify(code, per_value=True) is per_value


def test_error_code_of_pynvml_and_other_exceptions() -> None:
    assert pynvml_compat.error_code(nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)) == 15
    assert pynvml_compat.error_code(RuntimeError("broken binding")) == -1


def _compat_names() -> list[str]:
    return [name for name in vars(pynvml_compat)
            if name.startswith(("NVML_", "nvmlEventType")) and hasattr(pynvml, name)]


@pytest.mark.parametrize("name", _compat_names())
def test_code_tables_are_pynvmls_own_constants(name: str) -> None:
    assert getattr(pynvml_compat, name) == getattr(pynvml, name)


def test_every_code_compat_names_is_one_pynvml_has() -> None:
    names = [n for n in vars(pynvml_compat) if n.startswith(("NVML_", "nvmlEventType"))]
    assert len(names) == len(_compat_names()) > 50



# What nvidia-ml-py 12.535 (the oldest the package allows) does not define.
_NOT_IN_12_535 = (
    "NVML_ERROR_GPU_NOT_FOUND",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT",
)


def test_with_an_old_pynvml_the_missing_codes_default_to_nvml_h(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = types.ModuleType("pynvml")
    old.__dict__.update({k: v for k, v in vars(pynvml).items() if k not in _NOT_IN_12_535})
    monkeypatch.setitem(sys.modules, "pynvml", old)
    # a private copy of the module: the backend keeps using the real one
    spec = importlib.util.spec_from_file_location("pynvml_compat_on_old_pynvml",
                                                  pynvml_compat.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    for name in _NOT_IN_12_535:
        assert getattr(copy, name) == getattr(pynvml, name), name
    assert copy.GPU_LOST_CODES == pynvml_compat.GPU_LOST_CODES


def test_field_value_array_decodes_every_value_type() -> None:
    kinds = {  # nvmlValueType_t -> (member of the value union, a value)
        pynvml.NVML_VALUE_TYPE_DOUBLE: ("dVal", -2.5),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: ("uiVal", 2**32 - 1),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: ("ulVal", 2**63 + 1),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: ("ullVal", 2**64 - 1),
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: ("sllVal", -(2**62)),
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: ("siVal", -7),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: ("usVal", 65535),
    }
    request = pynvml_compat.FieldValueArray(range(100, 100 + len(kinds)))
    assert request.values() is None  # no types learnt yet
    for entry, (kind, (member, value)) in zip(request.array, kinds.items(), strict=True):
        entry.valueType, entry.nvmlReturn = kind, pynvml.NVML_SUCCESS
        setattr(entry.value, member, value)
    expected = [float(value) for _, value in kinds.values()]
    assert [value for _, _, value in request.answers()] == expected
    assert list(map(float, request.values() or ())) == expected  # learnt: one unpack
    request.array[1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert request.values() is None
    assert request.answers()[1] == (101, pynvml.NVML_ERROR_NOT_SUPPORTED, None)
