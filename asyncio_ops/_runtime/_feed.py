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
from datetime import datetime
from typing import Any

import pyarrow as pa

from .._elements import Record, Watermark
from .._exceptions import ConfigurationError
from .._operator import AsyncWaitOperator
from ._adapters import RowFunction, RowValue, describe_row
from ._metrics import RunMetrics
from ._spec import PartitionSpec

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
        """Columnar: one element per zero-copy slice of ``chunk_size`` rows."""
        n = self.spec.chunk_size
        assert n is not None
        await self._feed_chunks([batch.slice(i, n) for i in range(0, batch.num_rows, n)])

    async def _feed_chunks(self, chunks: list[Any]) -> None:
        """One element per chunk; with a replay log, numbered and served from it if it can be."""
        op = self.op
        replay = self.replay
        if replay is None:
            await op.process_elements([RowValue(c) for c in chunks])
            return
        inputs: list[Any] = []
        for chunk in chunks:
            pos = self.position
            self.position += 1
            inputs.append(Record(RowValue(chunk, None, pos)))
        await self._process(inputs)

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
            self.metrics.replayed += 1
            await op.process_completed_element(element, row_fn.replayed(value, stored[1]))
            start = i + 1
        if start < len(inputs):
            await op.process_elements(inputs[start:] if start else inputs)

    async def feed(self, rows: list[dict[str, Any]]) -> None:
        op = self.op
        n = self.spec.chunk_size
        if n is not None:  # vectorised: one element per chunk of rows
            await self._feed_chunks([rows[i : i + n] for i in range(0, len(rows), n)])
            return
        if self.watermarks is None and self.replay is None:
            # the common case, kept lean: one RowValue per row, no per-row branches
            await op.process_elements([RowValue(row) for row in rows])
            return
        column = self.spec.event_time
        drop_late = self.spec.late_records == "drop"
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
