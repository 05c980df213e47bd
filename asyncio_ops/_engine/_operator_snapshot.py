"""What :meth:`AsyncWaitOperator.snapshot_state` returns and :meth:`~AsyncWaitOperator.open` takes.

A snapshot holds every element not yet emitted, in queue order; for each
record its results if it completed, else the attempts made and its absolute
deadline. Storing it is the runtime's job (typed Arrow, ``asyncio_ops._runtime``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .._elements import StreamElement

if TYPE_CHECKING:
    from ..options import OutputMode

SNAPSHOT_VERSION: Final = 1


@dataclass(frozen=True, slots=True, init=False)
class SnapshotEntry:
    """One element not yet emitted: the input, and its results if already complete.

    For an element still in flight, ``attempts`` made so far and its absolute
    ``deadline`` (processing time, seconds; None: a fresh budget on restore).

    Example:

    >>> import asyncio
    >>> from asyncio_ops import OperatorSnapshot, OutputMode, Record, SnapshotEntry, run_async_wait
    >>> snapshot = OperatorSnapshot((SnapshotEntry(Record(1), results=("one",)),  # completed
    ...                              SnapshotEntry(Record(2))), OutputMode.ORDERED)  # in flight
    >>> async def lookup(value):
    ...     return [f"looked up {value}"]
    >>> [r.value for r in asyncio.run(run_async_wait(lookup, [3], timeout=1.0, restored=snapshot))]
    ['one', 'looked up 2', 'looked up 3']
    """

    element: StreamElement
    results: tuple[Any, ...] | None = None
    key: Any = None
    attempts: int = 0
    deadline: float | None = None

    def __init__(
        self,
        element: StreamElement,
        results: tuple[Any, ...] | None = None,
        key: Any = None,
        attempts: int = 0,
        deadline: float | None = None,
    ) -> None:
        # one per element at every snapshot and restore: the slots are set directly,
        # not through the frozen dataclass's object.__setattr__ (a quarter of the cost)
        _set_element(self, element)
        _set_results(self, results)
        _set_key(self, key)
        _set_attempts(self, attempts)
        _set_deadline(self, deadline)


_set_element = SnapshotEntry.__dict__["element"].__set__
_set_results = SnapshotEntry.__dict__["results"].__set__
_set_key = SnapshotEntry.__dict__["key"].__set__
_set_attempts = SnapshotEntry.__dict__["attempts"].__set__
_set_deadline = SnapshotEntry.__dict__["deadline"].__set__


@dataclass(frozen=True)
class OperatorSnapshot:
    """What :meth:`AsyncWaitOperator.snapshot_state` returns (picklable).

    Example:

    >>> import asyncio
    >>> from asyncio_ops import AsyncWaitOperator, Record
    >>> async def main():
    ...     never = asyncio.Event()
    ...     async def slow(value):
    ...         await never.wait()
    ...         return [value]
    ...     op = AsyncWaitOperator(slow, output=print, timeout=60.0)
    ...     await op.open()
    ...     await op.process_element(Record(1))
    ...     snapshot = op.snapshot_state()  # what is not emitted yet
    ...     await op.close()
    ...     return snapshot
    >>> [(e.element, e.results, e.attempts) for e in asyncio.run(main()).entries]
    [(Record(value=1, timestamp=None), None, 1)]
    """

    entries: tuple[SnapshotEntry, ...]
    mode: OutputMode
    version: int = SNAPSHOT_VERSION

    def __len__(self) -> int:
        return len(self.entries)
