"""The bookkeeping of one read of one GPU: what answered, what failed and how.

Every NVML call of a read (getters, field-value batches, GPM) reports its exception
here, where :func:`stepscope.gpu.pynvml_compat.classify` decides what it means:
"not supported" is not an error (the caller stops asking), "GPU lost" raises
:class:`~stepscope.gpu.model.GpuUnavailable`, anything else is a collect error, warned
about once per call and GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from stepscope.gpu.model import GpuUnavailable
from stepscope.gpu.pynvml_compat import Failure, classify, error_code

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ReadPass:
    """One read of GPU ``index``: successes, errors, "unknown" answers.

    ``warned``: the calls already warned about on this GPU (kept across reads).
    """

    index: int
    warned: set[str]
    errors: int = 0
    ok: int = 0
    unknown: int = 0

    def failed(self, name: str, exc: Exception) -> bool:
        """Classify a call's exception. True: unsupported, do not call it again.

        Raises GpuUnavailable when the exception says the device is gone.
        """
        failure = classify(error_code(exc))
        if failure is Failure.GPU_LOST:
            raise GpuUnavailable(f"{name}: {exc}")
        if failure is Failure.UNSUPPORTED:
            log.debug("GPU %d: %s not supported (%s); not asked again", self.index, name, exc)
            return True
        self.errors += 1
        if failure is Failure.UNKNOWN:
            self.unknown += 1
        if name not in self.warned:
            self.warned.add(name)
            log.warning("GPU %d: %s failed: %s", self.index, name, exc)
        return False
