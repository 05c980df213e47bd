"""The input side of a partition: rows into operator elements, watermarks, late rows, replay.

Per input batch, :class:`Feeder` turns rows into :class:`RowValue` elements
and hands them to the operator in input order. With ``event_time`` it reads
each row's event time, marks (or drops) rows behind the current watermark
and, every ``watermark_interval`` rows, puts the watermark
(:class:`BoundedOutOfOrderness`: highest event time seen minus the delay)
into the operator. With a checkpoint it numbers the rows and serves the
lookups an earlier attempt of the task completed from the replay log instead
of requesting them again (same position and same row fingerprint only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa

from .._elements import Record, Watermark
from .._engine._wait_operator import AsyncWaitOperator
from .._exceptions import ConfigurationError
from ._adapters import RowFunction, RowValue, describe_row
from ._metrics import RunMetrics
from ._spec import KEY_GROUP_COLUMN, PartitionSpec

Replay = dict[int, tuple[bytes, Any]]
"""Logged completions by element position (a row, or a chunk): (fingerprint, results)."""


def event_time_seconds(value: Any, column: str, row: Any) -> float:
    """Event time of a row in seconds: timestamp, date or number columns."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if value is None:
        raise ConfigurationError(
            f"event_time column {column!r} is null in row {describe_row(row)}; "
            "filter or fill such rows before the async operator"
        )
    raise ConfigurationError(
        f"event_time column {column!r} holds {type(value).__name__} {value!r:.50}; "
        "use a timestamp or numeric column"
    )


class BoundedOutOfOrderness:
    """Watermark = highest event time seen - delay, emitted every ``interval`` rows.

    Its state (``max_seen``, ``current``) is part of a checkpoint: a streaming
    query's next micro-batch starts from the watermark the last one reached.
    """

    def __init__(self, delay: float, interval: int) -> None:
        self.delay = delay
        self.interval = max(1, interval)
        self.max_seen = -math.inf
        self.current = -math.inf
        self._since = 0

    def restore(self, max_seen: float, current: float) -> None:
        """Continue from a checkpointed state (never moves the watermark back)."""
        self.max_seen = max(self.max_seen, max_seen)
        self.current = max(self.current, current)

    def observe(self, ts: float) -> float | None:
        """Record ``ts``; return a new watermark to emit, if it is time for one."""
        if ts > self.max_seen:
            self.max_seen = ts
        self._since += 1
        if self._since >= self.interval:
            self._since = 0
            candidate = self.max_seen - self.delay
            if candidate > self.current:
                self.current = candidate
                return candidate
        return None


class Feeder:
    """Turns rows into operator input: positions, replayed results, watermarks, late rows."""

    def __init__(
        self,
        op: AsyncWaitOperator,
        spec: PartitionSpec,
        row_fn: RowFunction,
        watermarks: BoundedOutOfOrderness | None,
        metrics: RunMetrics,
        replay: Replay | None,
    ) -> None:
        self.op = op
        self.spec = spec
        self.row_fn = row_fn
        self.watermarks = watermarks
        self.metrics = metrics
        self.replay = replay
        self.position = 0

    async def feed_arrow(self, batch: pa.RecordBatch) -> None:
        """Columnar: one element per chunk, a slice (or a take) of ``batch``."""

        def take(indices: Sequence[int]) -> pa.RecordBatch:
            if type(indices) is range:  # consecutive rows: a zero-copy slice
                return batch.slice(indices.start, len(indices))
            return batch.take(pa.array(indices, pa.int64()))

        await self._feed_chunks(batch.num_rows, batch, None, take)

    async def _feed_row_chunks(self, rows: list[dict[str, Any]]) -> None:
        def take(indices: Sequence[int]) -> list[dict[str, Any]]:
            if type(indices) is range:
                return rows[indices.start : indices.stop]
            return [rows[i] for i in indices]

        await self._feed_chunks(len(rows), None, rows, take)

    async def _feed_chunks(
        self,
        n: int,
        batch: pa.RecordBatch | None,
        rows: list[dict[str, Any]] | None,
        take: Callable[[Sequence[int]], Any],
    ) -> None:
        """The chunks :meth:`_plan_chunks` cuts, as elements (``take`` makes each one's
        input from its row indices), with the watermarks between them."""
        inputs: list[Any] = []
        for item in self._plan_chunks(n, batch, rows):
            if type(item) is Watermark:
                inputs.append(item)
                continue
            indices, late, ts = item
            inputs.append(self._chunk_record(take(indices), late, ts))
        await self._process(inputs)

    def _chunk_record(self, chunk: Any, late: list[bool] | None, ts: float | None) -> Any:
        """A chunk element, numbered with a replay log; a bare value in the plain case."""
        if self.replay is None and ts is None and late is None:
            return RowValue(chunk)
        pos = self.position
        self.position += 1
        return Record(RowValue(chunk, late, pos if self.replay is not None else None), ts)

    def _plan_chunks(
        self, n: int, batch: pa.RecordBatch | None, rows: list[dict[str, Any]] | None
    ) -> list[Any]:
        """Cut ``n`` input rows into chunks, in input order, with watermarks between them.

        Each item is a :class:`Watermark` or ``(row indices, lateness per row or
        None, event time of the chunk or None)``; indices are a ``range`` when
        the rows are consecutive. Rules: a chunk has at most ``chunk_size``
        rows; with event time, no chunk spans a watermark (rows are marked
        late, or dropped, as in row mode, and the watermark advances every
        ``watermark_interval`` rows kept), and a chunk's event time is the
        latest of its rows; with a key, every row of a chunk is of one key
        group (rows are grouped by key group within the stretch between two
        watermarks, each group keeping its order), so a chunk has one key.
        """
        size = self.spec.chunk_size
        assert size is not None
        groups: list[int] | None = None
        if self.spec.key:
            if batch is not None:
                groups = batch.column(KEY_GROUP_COLUMN).to_pylist()
            else:
                assert rows is not None
                groups = [row[KEY_GROUP_COLUMN] for row in rows]
        watermarks = self.watermarks
        out: list[Any] = []
        if watermarks is None:
            self._cut(range(n), None, None, groups, size, out)
            return out
        column = self.spec.options.event_time
        assert column is not None
        values = batch.column(column).to_pylist() if batch is not None else None
        drop_late = self.spec.options.late_records == "drop"
        kept: list[int] = []
        flags: list[bool] = []
        stamps: list[float] = []
        metrics = self.metrics
        for i in range(n):
            row = rows[i] if rows is not None else None
            value = values[i] if values is not None else row[column]  # type: ignore[index]
            ts = event_time_seconds(value, column, row if row is not None else {column: value})
            late = ts < watermarks.current
            if late:
                metrics.late += 1
                if drop_late:
                    metrics.dropped_late += 1
                    continue
            kept.append(i)
            flags.append(late)
            stamps.append(ts)
            wm = watermarks.observe(ts)
            if wm is not None:
                self._cut(kept, flags, stamps, groups, size, out)
                kept, flags, stamps = [], [], []
                out.append(Watermark(wm))
        self._cut(kept, flags, stamps, groups, size, out)
        return out

    @staticmethod
    def _cut(
        indices: Sequence[int],
        flags: list[bool] | None,
        stamps: list[float] | None,
        groups: list[int] | None,
        size: int,
        out: list[Any],
    ) -> None:
        """Chunks of ``indices`` (one stretch between watermarks) onto ``out``."""
        if not indices:
            return
        runs: list[list[int]]  # positions within ``indices``
        if groups is None:
            runs = [list(range(len(indices)))]
        else:
            by_group: dict[int, list[int]] = {}
            for j, i in enumerate(indices):
                by_group.setdefault(groups[i], []).append(j)
            runs = list(by_group.values())
        for run in runs:
            for start in range(0, len(run), size):
                part = run[start : start + size]
                if type(indices) is range and groups is None:
                    chosen: Sequence[int] = indices[part[0] : part[-1] + 1]  # still a range
                else:
                    chosen = [indices[j] for j in part]
                late = [flags[j] for j in part] if flags is not None else None
                ts = max(stamps[j] for j in part) if stamps is not None else None
                out.append((chosen, late, ts))

    async def _process(self, inputs: list[Any]) -> None:
        """Hand ``inputs`` (records, watermarks) to the operator in one call per run of
        them; an element with a logged completion goes in on its own, without a request."""
        op = self.op
        replay = self.replay
        if replay is None:
            await op.process_elements(inputs)
            return
        row_fn = self.row_fn
        start = 0
        for i, element in enumerate(inputs):
            if type(element) is not Record:
                continue
            value = element.value
            stored = replay.get(value.position)
            if stored is None or stored[0] != row_fn.fingerprint(value):
                continue
            if start < i:
                await op.process_elements(inputs[start:i])
            # a chunk counts its rows
            self.metrics.replayed += len(value.row) if self.spec.chunk_size is not None else 1
            await op.process_completed_element(element, row_fn.replayed(value, stored[1]))
            start = i + 1
        if start < len(inputs):
            await op.process_elements(inputs[start:] if start else inputs)

    async def feed(self, rows: list[dict[str, Any]]) -> None:
        op = self.op
        if self.spec.chunk_size is not None:  # vectorised: one element per chunk of rows
            await self._feed_row_chunks(rows)
            return
        if self.watermarks is None and self.replay is None:
            # the common case, kept lean: one RowValue per row, no per-row branches
            await op.process_elements([RowValue(row) for row in rows])
            return
        column = self.spec.options.event_time
        drop_late = self.spec.options.late_records == "drop"
        watermarks = self.watermarks
        numbered = self.replay is not None
        inputs: list[Any] = []
        for row in rows:
            pos = self.position
            self.position += 1
            ts: float | None = None
            late: bool | None = None
            if watermarks is not None:
                assert column is not None
                ts = event_time_seconds(row.get(column), column, row)
                late = ts < watermarks.current
                if late:
                    self.metrics.late += 1
                    if drop_late:
                        self.metrics.dropped_late += 1
                        continue
            inputs.append(Record(RowValue(row, late, pos if numbered else None), ts))
            if watermarks is not None:
                assert ts is not None
                wm = watermarks.observe(ts)
                if wm is not None:
                    inputs.append(Watermark(wm))
        await self._process(inputs)
