"""The rule that an integration's callback never raises into the training loop."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

log = logging.getLogger("stepscope.train")

F = TypeVar("F", bound=Callable[..., Any])


class _Counts(Protocol):
    errors: int
    _logged: set[str]


def guarded(method: F) -> F:
    """Run a callback method, swallowing its errors: count them in ``self.errors``
    and log each method's first one. The training loop never sees our failures."""

    @functools.wraps(method)
    def wrapper(self: _Counts, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as err:
            self.errors += 1
            if method.__name__ not in self._logged:
                self._logged.add(method.__name__)
                log.warning("stepscope: %s failed (counted, training goes on): %r",
                            method.__name__, err)
            return None

    return wrapper  # type: ignore[return-value]
