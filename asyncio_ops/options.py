"""Validation of options: one place for seconds, counts, choices and path segments.

Every function takes the value and the option's name and returns the value in
its canonical form, or raises :class:`ConfigurationError` naming the option and
the value. The operator, the runtime, the Spark API and the connectors all
validate through these, so one option reads and fails the same everywhere (a
public module, so that connectors and user code can use it too).

Durations follow Spark's conventions too: besides seconds (int or float) and
``timedelta``, an interval string such as ``"2 seconds"``, ``"500 milliseconds"``
or ``"1 minute"`` is accepted.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Final, TypeVar

from ._exceptions import ConfigurationError

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_MAX_CAPACITY",
    "OutputMode",
    "at_least",
    "choice",
    "int_between",
    "non_negative_int",
    "path_segment",
    "positive_int",
    "positive_seconds",
    "seconds",
    "seconds_or_zero",
]


DEFAULT_CAPACITY: Final = 100
"""Elements in flight per operator instance when ``capacity`` is not given (Flink's 100)."""
DEFAULT_MAX_CAPACITY: Final = 1024
"""The bound of ``capacity="auto"``'s adaptive limit when ``max_capacity`` is not given."""


class OutputMode(enum.Enum):
    """Order in which results leave the operator (the ``mode`` of the async operator;
    ``ordered_wait`` / ``unordered_wait`` choose it).

    Example:

    >>> from asyncio_ops import OutputMode
    >>> OutputMode("unordered") is OutputMode.UNORDERED
    True
    """

    ORDERED = "ordered"
    """Input order, watermarks included (Flink's orderedWait)."""
    UNORDERED = "unordered"
    """Completion order; processing time only, watermarks are an error."""
    WATERMARK_BOUNDED = "watermark_bounded"
    """Completion order between watermarks; nothing crosses a watermark."""


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


def seconds(
    value: object,
    name: str,
    *,
    low: float = 0.0,
    high: float = math.inf,
    low_ok: bool = False,
    infinite_ok: bool = False,
) -> float:
    """A duration in ``(low, high]`` (``[low, high]`` with ``low_ok``); infinity only if allowed."""
    s = _as_seconds(value, name)
    if math.isinf(s) and s > 0:
        if infinite_ok:
            return s
        raise ConfigurationError(f"{name} must be a finite number of seconds, got {value!r}")
    above = s >= low if low_ok else s > low
    if not (above and s <= high):  # NaN fails both
        lower = f">= {low:g}" if low_ok else f"> {low:g}"
        upper = f" and <= {high:g}" if high < math.inf else ""
        raise ConfigurationError(f"{name} must be {lower}{upper} seconds, got {value!r}")
    return s


def positive_seconds(value: object, name: str) -> float:
    """A duration > 0 (a timeout, a drain timeout)."""
    return seconds(value, name, infinite_ok=True)


def seconds_or_zero(value: object, name: str) -> float:
    """A duration >= 0; None means 0 (a watermark delay)."""
    if value is None:
        return 0.0
    return seconds(value, name, low_ok=True)


def capacity_or_auto(value: object, name: str = "capacity") -> int | str:
    """An int > 0, or ``"auto"`` (an adaptive limit: asyncio_ops._engine._limit)."""
    if value == "auto":
        return "auto"
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigurationError(f"{name} must be an int > 0 or 'auto', got {value!r}")
    return value


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


def int_between(value: object, name: str, low: int, high: int) -> int:
    """An int in ``[low, high]``."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigurationError(f"{name} must be an int in [{low}, {high}], got {value!r}")
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
