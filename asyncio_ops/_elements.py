"""Stream elements: the two things that flow through an operator.

A :class:`Record` carries a user value and, optionally, its event timestamp
(seconds or milliseconds, whatever the job uses, as long as it is consistent
with the watermarks). A :class:`Watermark` says that no record with a smaller
timestamp is expected any more.

Both are frozen, hashable and compare by value, so that tests and snapshots can
compare them directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True, init=False)
class Record(Generic[T]):
    """A data element: ``value`` with an optional event ``timestamp``.

    Example:

    >>> from asyncio_ops import Record
    >>> Record({"customer_id": 7}, timestamp=1700000000.0).timestamp
    1700000000.0
    """

    value: T
    timestamp: float | None = None

    def __init__(self, value: T, timestamp: float | None = None) -> None:
        # one record per input row: the slots are set directly, not through the
        # frozen dataclass's object.__setattr__ (a third of the cost)
        _set_value(self, value)
        _set_timestamp(self, timestamp)

    def with_value(self, value: Any) -> Record[Any]:
        """The same timestamp around another value (how results inherit it)."""
        return Record(value, self.timestamp)


_set_value = Record.__dict__["value"].__set__
_set_timestamp = Record.__dict__["timestamp"].__set__


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event-time progress: no record with ``timestamp <= this`` is expected any more.

    Example:

    >>> import asyncio
    >>> from asyncio_ops import OutputMode, Record, Watermark, run_async_wait
    >>> async def lookup(value):
    ...     return [value * 10]
    >>> asyncio.run(run_async_wait(lookup, [Record(1, 1.0), Watermark(1.0), Record(2, 2.0)],
    ...                            timeout=1.0, mode=OutputMode.WATERMARK_BOUNDED))
    [Record(value=10, timestamp=1.0), Watermark(timestamp=1.0), Record(value=20, timestamp=2.0)]
    """

    timestamp: float


StreamElement = Record[Any] | Watermark
