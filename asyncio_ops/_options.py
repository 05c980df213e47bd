"""Validation of options: one place for seconds, counts, choices and path segments.

Every function takes the value and the option's name and returns the value in
its canonical form, or raises :class:`ConfigurationError` naming the option and
the value. The operator, the runtime and the Spark API all validate through
these, so one option reads and fails the same everywhere.

Durations follow Spark's conventions too: besides seconds (int or float) and
``timedelta``, an interval string such as ``"2 seconds"``, ``"500 milliseconds"``
or ``"1 minute"`` is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Final, TypeVar

from ._exceptions import ConfigurationError

T = TypeVar("T")

_UNITS: Final = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}  # fmt: skip
_INTERVAL: Final = re.compile(r"^\s*(?:interval\s+)?([0-9]*\.?[0-9]+)\s*([a-z]+)\s*$", re.I)
_SEGMENT: Final = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


def _as_seconds(value: object, name: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        m = _INTERVAL.match(value)
        unit = _UNITS.get(m.group(2).lower()) if m else None
        if m is None or unit is None:
            raise ConfigurationError(
                f"{name} {value!r} is not a duration; use seconds, a timedelta or an interval "
                "string such as '2 seconds', '500 milliseconds' or '1 minute'"
            )
        return float(m.group(1)) * unit
    raise ConfigurationError(
        f"{name} must be seconds (int or float), a timedelta or an interval string, got {value!r}"
    )


def positive_seconds(value: object, name: str) -> float:
    """A duration > 0 (a timeout, a drain timeout)."""
    seconds = _as_seconds(value, name)
    if not seconds > 0:  # NaN too; infinity is an unbounded budget
        raise ConfigurationError(f"{name} must be > 0 seconds, got {value!r}")
    return seconds


def seconds_or_zero(value: object, name: str) -> float:
    """A duration >= 0; None means 0 (a watermark delay)."""
    if value is None:
        return 0.0
    seconds = _as_seconds(value, name)
    if not seconds >= 0 or math.isinf(seconds):
        raise ConfigurationError(f"{name} must be >= 0 seconds, got {value!r}")
    return seconds


def positive_int(value: object, name: str) -> int:
    """An int > 0 (capacity, batch sizes, intervals in rows)."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigurationError(f"{name} must be an int > 0, got {value!r}")
    return value


def non_negative_int(value: object, name: str) -> int:
    """An int >= 0 (an output buffer, a pinned version)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigurationError(f"{name} must be an int >= 0, got {value!r}")
    return value


def at_least(value: object, name: str, minimum: int) -> int:
    """An int >= ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def choice(value: T, name: str, choices: Sequence[T]) -> T:
    """One of ``choices``."""
    if value not in choices:
        raise ConfigurationError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def path_segment(value: object, name: str) -> str:
    """One path segment: letters, digits, ``_``, ``.``, ``-`` (no ``/``, not ``.`` or ``..``)."""
    if not isinstance(value, str) or not _SEGMENT.match(value) or value in (".", ".."):
        raise ConfigurationError(
            f"{name} must be one path segment of letters, digits, '_', '.' and '-' "
            f"(at most 100 characters, not '.' or '..'), got {value!r}"
        )
    return value
