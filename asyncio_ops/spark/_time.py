"""``Time``: PyFlink's duration class, so that ported code keeps ``Time.seconds(5)``.

PyFlink's ``pyflink.common.time.Time`` is a number of milliseconds built with
``Time.milliseconds(n)``, ``Time.seconds(n)``, ``Time.minutes(n)``,
``Time.hours(n)`` or ``Time.days(n)`` and read with ``to_milliseconds()``; this
one has the same names and meaning. Anything with ``to_milliseconds()`` (this
class or PyFlink's own) is accepted as ``AsyncDataStream``'s ``timeout``; for
the other functions, which take seconds, a ``timedelta`` or an interval string,
``Time.seconds(5).to_timedelta()`` converts. A negative amount is refused
(ConfigurationError naming the value); zero is kept, and refused where a
positive timeout is needed, as a timeout of ``0`` is.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from .._exceptions import ConfigurationError

_MS_PER: Final = {
    "milliseconds": 1,
    "seconds": 1000,
    "minutes": 60_000,
    "hours": 3_600_000,
    "days": 86_400_000,
}


class Time:
    """A duration in whole milliseconds, as PyFlink's ``Time``.

    Example:

    >>> from asyncio_ops.spark import Time
    >>> Time.seconds(5).to_milliseconds(), Time.minutes(2)
    (5000, Time.milliseconds(120000))
    >>> Time.seconds(1) == Time.milliseconds(1000), Time.hours(1).to_timedelta()
    (True, datetime.timedelta(seconds=3600))
    """

    __slots__ = ("_ms",)

    def __init__(self, milliseconds: int) -> None:
        if isinstance(milliseconds, bool) or not isinstance(milliseconds, int):
            raise ConfigurationError(
                f"Time takes whole milliseconds (an int), got {milliseconds!r}"
            )
        if milliseconds < 0:
            raise ConfigurationError(f"Time must not be negative, got {milliseconds} ms")
        self._ms = milliseconds

    @staticmethod
    def _of(amount: int, unit: str) -> Time:
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise ConfigurationError(f"Time.{unit}() takes an int, got {amount!r}")
        if amount < 0:
            raise ConfigurationError(f"Time.{unit}() must not be negative, got {amount}")
        return Time(amount * _MS_PER[unit])

    @staticmethod
    def milliseconds(milliseconds: int) -> Time:
        return Time._of(milliseconds, "milliseconds")

    @staticmethod
    def seconds(seconds: int) -> Time:
        return Time._of(seconds, "seconds")

    @staticmethod
    def minutes(minutes: int) -> Time:
        return Time._of(minutes, "minutes")

    @staticmethod
    def hours(hours: int) -> Time:
        return Time._of(hours, "hours")

    @staticmethod
    def days(days: int) -> Time:
        return Time._of(days, "days")

    def to_milliseconds(self) -> int:
        return self._ms

    def to_timedelta(self) -> timedelta:
        return timedelta(milliseconds=self._ms)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Time) and other._ms == self._ms

    def __hash__(self) -> int:
        return hash(self._ms)

    def __repr__(self) -> str:
        return f"Time.milliseconds({self._ms})"
