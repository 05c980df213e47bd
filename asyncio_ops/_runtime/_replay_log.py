"""The replay log: the lookups one task attempt completed, flushed by count and by time.

``results-p<i>-<token>-<seq>`` files of a version or run directory: row
position, row fingerprint and the function's results typed by the output
columns. Written every ``flush_rows`` lookups or ``flush_interval`` seconds,
so a retried attempt re-requests at most the elements in flight plus the
lookups of one unflushed stretch.

:func:`read_segment` reads one file, its columns checked (a restore's
``load_replay`` and ``read_state``'s ``replay_log=True`` both read through
it); :func:`segment_of` takes a file's name apart.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Final, NamedTuple

import pyarrow as pa

from .._exceptions import CheckpointError, OutputSchemaError
from .._storage._checkpoint_storage import CheckpointStorage, Version
from .._storage._container import Kind
from ._coerce import coerced_array

COLUMNS: Final = ("position", "fingerprint", "results")
_NAME: Final = re.compile(r"^results-p(\d{5,})-([0-9a-f]+)-(\d{6,})\.ckpt$")


class Segment(NamedTuple):
    """What a replay-log file's name says: partition, attempt token, segment number."""

    partition: int
    attempt: str
    segment: int


def segment_name(partition: int, attempt: str, segment: int) -> str:
    """The file name of one segment: ``results-p<i>-<attempt>-<seq>.ckpt``."""
    return f"results-p{partition:05d}-{attempt}-{segment:06d}.ckpt"


def segment_of(name: str) -> Segment | None:
    """The parts of a segment's file name (None: not a segment's name)."""
    m = _NAME.match(name)
    return None if m is None else Segment(int(m.group(1)), m.group(2), int(m.group(3)))


def read_segment(storage: CheckpointStorage, version: Version, name: str) -> pa.Table:
    """One segment's table (``position``, ``fingerprint``, ``results``); CheckpointError
    naming the file if it lacks one of them."""
    table = storage.read(version, name, Kind.REPLAY_LOG)
    missing = set(COLUMNS) - set(table.column_names)
    if missing:
        raise CheckpointError(
            f"checkpoint file {storage.path(version, name)} lacks the column(s) {sorted(missing)}"
        )
    return table


def _explain(values: list[Any], type_: pa.DataType, what: str, exc: Exception) -> OutputSchemaError:
    """Name the first value that ``type_`` cannot hold."""
    for i, value in enumerate(values):
        try:
            pa.array([value], type=type_)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            return OutputSchemaError(f"{what} {i} cannot be written as {type_}: {value!r:.300}")
    return OutputSchemaError(f"{what} cannot be written as {type_}: {exc}")


def _array(values: list[Any], type_: pa.DataType, what: str) -> pa.Array:
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        array = coerced_array(values, type_)  # as the output does (see _coerce)
        if array is None:
            raise _explain(values, type_, what, exc) from exc
        return array


class ReplayLog:
    """Completed lookups of one task attempt, flushed by count and by time (module docstring)."""

    def __init__(
        self,
        storage: CheckpointStorage,
        version: Version,
        partition: int,
        results_type: pa.DataType,
        flush_rows: int,
        flush_interval: float,
    ) -> None:
        self.storage = storage
        self.version = version
        self.partition = partition
        self.results_type = results_type
        self.flush_rows = flush_rows
        self.flush_interval = flush_interval
        self.token = uuid.uuid4().hex[:12]
        self.segment = 0
        self.flushes = 0
        self._positions: list[int] = []
        self._fingerprints: list[bytes] = []
        self._results: list[Any] = []
        self._last = time.monotonic()

    def __len__(self) -> int:
        return len(self._positions)

    def append(self, position: int, fp: bytes, results: Any) -> None:
        """Log one completion: Python values of ``results_type``, or an Arrow batch of rows."""
        self._positions.append(position)
        self._fingerprints.append(fp)
        self._results.append(results.to_struct_array() if isinstance(results, pa.RecordBatch)
                             else results)  # fmt: skip
        if len(self._positions) >= self.flush_rows or (
            time.monotonic() - self._last >= self.flush_interval
        ):
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as one segment file (nothing if empty)."""
        self._last = time.monotonic()
        if not self._positions:
            return
        table = pa.table(
            {
                "position": pa.array(self._positions, pa.int64()),
                "fingerprint": pa.array(self._fingerprints, pa.binary()),
                "results": self._results_array(),
            }
        )
        name = segment_name(self.partition, self.token, self.segment)
        self.segment += 1
        self.flushes += 1
        self.storage.write(self.version, name, Kind.REPLAY_LOG, table)
        self._positions, self._fingerprints, self._results = [], [], []

    def _results_array(self) -> pa.Array:
        results = self._results
        if results and isinstance(results[0], pa.StructArray):  # columnar chunks: no Python
            offsets = [0]
            for r in results:
                offsets.append(offsets[-1] + len(r))
            values = pa.concat_arrays(results)
            array = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
            return array.cast(self.results_type)
        return _array(results, self.results_type, "logged result of element")
