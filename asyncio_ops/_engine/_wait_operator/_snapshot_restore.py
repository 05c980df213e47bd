"""Snapshot and restore: every element not yet emitted, and its replay before new input.

Owns :meth:`_Snapshots.snapshot_state` and the replay of its result by ``open``
(:meth:`~_Snapshots._restore`). A snapshot holds every element not yet emitted,
in queue order, with the results of those already complete and, for the others,
the attempts made and the absolute deadline (the element's timeout timer); input
given to a ``process_*`` call still waiting for room follows the queue's
elements. Restoring puts the snapshot's elements before any new input: a
complete one is emitted without a new request, the others are re-invoked, each
keeping its deadline and attempt count (:meth:`~_Snapshots._admit_restored`,
called by the worker that takes it); one whose deadline passed while it was
stored times out at once, so a slow element is never granted a fresh budget.

Call order: ``snapshot_state`` at any point between the feeder's calls;
``_restore`` once, from ``open``, before any ``process_*``.
"""

from __future__ import annotations

from typing import Any

from ..._elements import Record, Watermark
from ..._exceptions import ConfigurationError
from ...options import OutputMode
from .._operator_snapshot import SNAPSHOT_VERSION, OperatorSnapshot, SnapshotEntry
from ._core import _Entry, _OperatorCore, _Restored


def _record_of(element: Any) -> Record[Any]:
    """The record of a restored element or of a plain one."""
    return element.record if type(element) is _Restored else element


class _Snapshots(_OperatorCore):
    """Snapshot and restore (see the module docstring)."""

    def snapshot_state(self) -> OperatorSnapshot:
        """Every element not yet emitted, in input order, with results where complete.

        An element that completed exceptionally is stored without results, so a
        restore tries it again; input not yet in the queue (given to a
        ``process_*`` call still waiting for room) follows the queue's elements.
        """
        entries = []
        for handle in self._queue.entries():
            element = handle.element
            if type(element) is Watermark:
                entries.append(SnapshotEntry(element))
                continue
            key = handle.key
            if handle.done and handle.exception is None:
                entries.append(SnapshotEntry(element, tuple(handle.results), key))
                continue
            assert isinstance(handle, _Entry)
            if handle.exception is not None:  # failed: tried again, with a fresh budget
                entries.append(SnapshotEntry(element, None, key))
                continue
            entries.append(SnapshotEntry(element, None, key, handle.attempts, handle.deadline))
        select = self._key_selector
        for item in self._pending:
            t = type(item)
            if t is Watermark:
                entries.append(SnapshotEntry(item))
                continue
            if t is _Restored:
                record = item.record
                results = item.results
                attempts, deadline = item.attempts, item.deadline
            else:
                record = item if t is Record else Record(item)
                results, attempts, deadline = None, 0, None
            key = select(record.value) if select is not None else None
            entries.append(SnapshotEntry(record, results, key, attempts, deadline))
        return OperatorSnapshot(tuple(entries), self.mode)

    async def _restore(self, restored: OperatorSnapshot) -> None:
        """Replay ``restored`` (from :meth:`snapshot_state`) before any new input."""
        if not isinstance(restored, OperatorSnapshot):
            raise ConfigurationError(
                "restored must be an OperatorSnapshot from snapshot_state(), "
                f"got {type(restored)!r}"
            )
        if restored.version > SNAPSHOT_VERSION:
            raise ConfigurationError(
                f"snapshot format version {restored.version} is newer than this version of "
                f"asyncio_ops understands ({SNAPSHOT_VERSION})"
            )
        replay: list[Any] = []
        for entry in restored.entries:
            element = entry.element
            if type(element) is Watermark:
                if self.mode is OutputMode.UNORDERED:
                    self._queue.try_put(element)  # raises WatermarkNotSupportedError
                replay.append(element)
            elif entry.results is not None:
                replay.append(_Restored(element, tuple(entry.results)))  # type: ignore[arg-type]
            elif entry.deadline is None:
                replay.append(element)
            else:
                replay.append(_Restored(element, None, entry.attempts, entry.deadline))  # type: ignore[arg-type]
        self._restored += sum(
            1 if type(e) is Watermark else self._weigh(_record_of(e).value) for e in replay
        )
        await self._enqueue(replay)

    def _admit_restored(self, element: _Restored) -> _Entry | None:
        """Put a restored element in the queue; the entry to run, if it is in flight."""
        record = element.record
        self._elements += 1
        self._received += self._weigh(record.value)
        key = self._key_selector(record.value) if self._key_selector is not None else None
        entry: _Entry | None = self._queue.try_put(record, key)  # type: ignore[assignment]
        assert entry is not None, "room was checked"
        self._queued += 1
        if element.results is not None:
            entry.complete(element.results)  # no request, no timer
            self._emit()
            return None
        deadline = element.deadline
        assert deadline is not None
        self._track(entry, max(0, element.attempts), self._clock_now(), deadline)
        if deadline <= self._clock_now():
            self._on_timeout(entry)  # its budget ran out while it was stored
            return None
        return entry
