"""What a micro-batch carries over: in-flight elements, their deadlines, watermarks.

At the end of a streaming micro-batch every element not yet emitted (in
flight, or complete but held back by the queue's order) is written; the next
micro-batch restores it before any new input. The mapping is Flink's (the
elements follow their key group; unkeyed, operator list state):

- **Keyed** (``key=``): a partition's elements are ONE Arrow table, sorted
  by key group (Spark computed it in the JVM, ``__aops_key_group``; never
  re-hashed in Python) and in queue order within one, the key group a
  ``key_group`` column: the one section of the partition's ``kg-p<i>`` file
  (kind ``IN_FLIGHT``, see ``_versions``), which its manifest names for every
  key group in it (tag ``SHARED``). Each element still waiting for its lookup
  keeps its absolute deadline in the ``deadline`` column. A key group follows
  to whichever partition owns it next, which reads the sections of the old
  partitions that held its key groups, each once, and keeps its key groups'
  rows (a key group missing where the manifest says it is: an error naming
  the file).
- **Unkeyed**: a partition's elements are one record batch, the one item of
  the union operator list state ``"in-flight-batch"`` (one item per old
  partition, so each is known by its partition); a new partition takes its
  old partition's batch at unchanged parallelism, else its part of all of
  them in partition order cut into near-equal parts (the even split, per
  element). The deadline travels inside the element as keyed.
- **Watermarks**: the highest event time seen and the current watermark are
  in the partition's manifest (``aops.watermark``, as ``keyed_process`` keeps
  them: :func:`manifest_watermark`): every new partition reads every old
  partition's and takes the maximum (Spark's watermark is global), before any
  element. So a keyed partition writes two files per version (its elements and
  its manifest), not three. Earlier releases kept them as union operator state
  ``"watermark"`` in the operator-state file, still read.

During a micro-batch the operator's timeouts are slot timers of its own
``"async-timeouts"`` service (one per 10 ms of deadlines, see
``asyncio_ops._engine._timeout_slots``); a restored element gets its exact stored
deadline back (``SnapshotEntry.deadline``), so it times out at its original
deadline with its attempt count, never with a fresh budget.

A batch is a table of stored elements (``_stored``: :class:`StoredElement`,
its schema typed by the input schema and the ``output_schema``; the
partition's manifest holds the element kind and the input schema once).
Every table read is validated fully before use (the container does it for a
key group's section; ``validate(full=True)`` for an operator-state batch); an
error names the file.

Why one table per partition and no state backend. Earlier releases stored each
element as one list-state element of its key, one Arrow record batch of one
row: 58 to 360 us per element against 0.6 to 0.9 us for one Arrow table of
the same rows (``python -m bench.carry_over``, 2,000 elements over 64 key
groups). The next layout made a key group's elements one value of keyed
state (a ``KeyedStateBackend``, heap or RocksDB) under the key group's own
key and each deadline a timer of that key: 14 to 48 us keyed, nearly all of
it the state layer's machinery per key group (a backend, a timer service,
a payload table of state rows and timer rows). A carry-over is bounded by
``capacity`` and ``output_buffer`` and never outlives one boundary, so it
needs none of what a backend gives (access by key, TTL, incremental
snapshots): it is written as the table itself. A table per key group (the
layout after that) still paid one Arrow stream per key group, about 40 us
each to write and to read back and validate; one table per partition pays
it once, and a carry-over is small enough (``capacity`` and
``output_buffer`` bound it) that a partition reading part of an old
partition's table after a rescale costs nothing worth a ranged read per key
group. Files of the keyed-state layout (kind ``KEY_GROUPS``, manifests
without ``aops.in_flight``) are still read, through a state backend of
``state_backend``
(:meth:`CarryOver.restore_keyed_state`). What remains per element is Arrow's
conversion and the operator's objects (:class:`SnapshotEntry`, ``Record``).

A restore puts the elements back in queue order (``_stored.in_order``).
"""

from __future__ import annotations

import math
import struct
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from .._exceptions import CheckpointError, StateError
from .._keygroups import KeyGroupRange
from .._storage._container import FULL, KEY_GROUP_FIELD, SHARED, Section
from .._timers import InternalTimerService, Timer
from ..state import (
    HeapKeyedStateBackend,
    KeyedStateBackend,
    OperatorStateBackend,
    RocksDBKeyedStateBackend,
    ValueStateDescriptor,
)
from ..state._keyed_snapshot import apply_change
from ._stored import ElementBatchSerializer, ElementSerializer, StoredElement

IN_FLIGHT_BATCH: Final = "in-flight-batch"
WATERMARK: Final = "watermark"
TIMEOUTS: Final = "async-timeouts"


@dataclass(frozen=True, slots=True)
class WatermarkState:
    """Highest event time seen and the current watermark (-inf: none yet)."""

    max_seen: float = -math.inf
    current: float = -math.inf

    def encoded(self) -> bytes:
        """As a manifest holds it (:data:`WATERMARK_META`): ``b"<max_seen>,<current>"``."""
        return f"{self.max_seen!r},{self.current!r}".encode()

    @staticmethod
    def highest(marks: Iterable[WatermarkState]) -> WatermarkState:
        """The union of partitions' watermark states: the highest of each."""
        marks = list(marks)
        return WatermarkState(
            max((m.max_seen for m in marks), default=-math.inf),
            max((m.current for m in marks), default=-math.inf),
        )


WATERMARK_META: Final = b"aops.watermark"
"""A partition's watermark state in its manifest's metadata (:meth:`WatermarkState.encoded`)."""


def manifest_watermark(manifest: pa.Table, path: str) -> WatermarkState | None:
    """The watermark state one partition's manifest holds; None if it holds none (the
    async operator's manifests of earlier releases: its operator-state file holds it).
    CheckpointError naming the file if it is unreadable."""
    raw = (manifest.schema.metadata or {}).get(WATERMARK_META)
    if raw is None:
        return None
    try:
        max_seen, current = (float(x) for x in raw.decode().split(","))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file {path}: unreadable watermark {raw!r}") from exc
    return WatermarkState(max_seen, current)


class _Float2:
    """Two floats as 16 bytes: the watermark state's item."""

    _S: Final = struct.Struct("<dd")

    def dumps(self, value: WatermarkState, /) -> bytes:
        return self._S.pack(value.max_seen, value.current)

    def loads(self, data: bytes | memoryview, /) -> WatermarkState:
        try:
            return WatermarkState(*self._S.unpack(data))
        except struct.error as exc:
            raise CheckpointError(f"a watermark state item is not two floats: {exc}") from exc


class _Bytes:
    """Bytes as they are: the unkeyed batch's operator-state item, decoded (and validated,
    naming its file) by the caller."""

    def dumps(self, value: bytes, /) -> bytes:
        return value

    def loads(self, data: bytes | memoryview, /) -> bytes:
        return bytes(data)


_BYTES: Final = _Bytes()


class _Held:
    """The timeouts' triggerable: they are held across the boundary, never fired here."""

    def on_processing_time(self, timer: Timer) -> None:  # pragma: no cover - never armed
        raise AssertionError(f"a held timeout fired: {timer!r}")

    on_event_time = on_processing_time


# -- the state of one partition ------------------------------------------------------------
class CarryOver:
    """Builds and reads one partition's carry-over state (see the module docstring).

    ``key_groups`` is the partition's key-group range (keyed), ``state_backend``
    ``"heap"`` or ``"rocksdb"`` (validated by the Spark API; only to read the keyed
    state of earlier releases). Written: one table per partition (keyed, a
    section of its key-group file) or one record batch (unkeyed, operator state).
    """

    def __init__(
        self,
        serializer: ElementSerializer,
        *,
        max_parallelism: int,
        key_groups: KeyGroupRange,
        state_backend: str = "heap",
    ) -> None:
        self.serializer = serializer
        self.batches = ElementBatchSerializer(serializer)
        self.max_parallelism = max_parallelism
        self.key_groups = key_groups
        self.state_backend = state_backend
        self._batch = ValueStateDescriptor[pa.RecordBatch](IN_FLIGHT_BATCH, serializer=self.batches)

    def _backend(self) -> KeyedStateBackend:
        return make_backend(self.state_backend, self.max_parallelism, self.key_groups)

    def _timers(self, backend: KeyedStateBackend) -> InternalTimerService:
        return InternalTimerService(
            TIMEOUTS, _Held(), key_context=backend, max_parallelism=self.max_parallelism,
            key_group_range=self.key_groups, armed=False,
        )  # fmt: skip

    # -- keyed --------------------------------------------------------------------------
    def snapshot_keyed(
        self, elements: Sequence[StoredElement], key_groups: Sequence[int]
    ) -> dict[int, Section]:
        """``{key_group: section}`` of ``elements``, each of the key group at its index in
        ``key_groups``: ONE section (tag ``SHARED``) for all the key groups, the table of
        the elements in their given (queue) order with their key group in a ``key_group``
        column: a container of kind ``IN_FLIGHT`` holds it once, its manifest names it
        for each key group (``_versions.write_version``). Not sorted by key group (as
        earlier releases wrote it, still read): every reader keeps the rows of its key
        groups by their column, and a restore at the same parallelism then finds them
        in queue order, with no reordering on either side."""
        if not elements:
            return {}
        kgs = pa.array(key_groups, pa.int32())
        table = pa.Table.from_batches([self.batches.to_batch(elements, deadlines=True)])
        table = table.append_column(pa.field(KEY_GROUP_FIELD, pa.int32(), nullable=False), kgs)
        groups = pc.unique(kgs).to_pylist()
        return dict.fromkeys(groups, Section(SHARED, table))

    def restore_keyed(self, sections: Iterable[tuple[str, Section]]) -> pa.Table:
        """The table of the elements of ``(file, section)`` pairs whose key group is in
        this partition's range: sections as :meth:`snapshot_keyed` wrote them (tag
        ``SHARED``, read whole: ``VersionFiles.element_sections``; the rows of other key
        groups are left out), or a key group's own (its tag: earlier releases wrote a
        section per key group). Row order is the sections' (a restore orders the
        elements itself: ``_stored.in_order``). CheckpointError names the file of a
        section that is not a full table of elements."""
        schema = self.batches.schema
        kgs = self.key_groups
        tables: list[pa.Table] = []
        for name, section in sections:
            table = section.table
            if section.tag == SHARED:
                index = table.schema.get_field_index(KEY_GROUP_FIELD)
                column = table.column(index) if index >= 0 else None
                if column is None or column.null_count:
                    raise CheckpointError(
                        f"checkpoint file {name}: in-flight elements of several key groups "
                        f"without the key group of each ({table.schema.names})"
                    )
                table = table.remove_column(index)
                low, high = pc.min_max(column).values()
                if table.num_rows and (low.as_py() < kgs.start or high.as_py() > kgs.end):
                    mask = pc.and_(
                        pc.greater_equal(column, kgs.start), pc.less_equal(column, kgs.end)
                    )
                    table = table.filter(mask)
                what = "the section of several key groups"
            elif section.tag not in kgs:
                continue
            else:
                what = f"key group {section.tag}"
            if section.part != FULL or not table.schema.remove_metadata().equals(schema):
                raise CheckpointError(
                    f"checkpoint file {name}: {what} is not a table of in-flight "
                    f"elements ({table.schema.names}, expected {schema.names})"
                )
            tables.append(table)
        return self.batches.table([b for t in tables for b in t.to_batches()])

    def restore_keyed_state(self, sections: Iterable[tuple[str, Section]]) -> pa.Table:
        """The table of the elements of ``(file, section)`` pairs written by earlier
        releases (each key group's elements one value of keyed state, their deadlines
        timers; kind ``KEY_GROUPS``), rebuilt in a state backend of ``state_backend``.
        CheckpointError names the file that does not read back."""
        backend = self._backend()
        timers = self._timers(backend)
        try:
            state = backend.get_state(self._batch)
            found: list[tuple[int, str, pa.RecordBatch]] = []
            for name, section in sections:
                kg = section.tag
                try:
                    apply_change(backend, timers, section, f"checkpoint file {name}")
                    if kg in self.key_groups:
                        backend.set_current_key(kg)
                        batch = state.value()
                        if batch is not None:
                            found.append((kg, name, batch))
                except (CheckpointError, StateError, ValueError, TypeError) as exc:
                    raise CheckpointError(f"checkpoint file {name}: {exc}") from exc
            by_kg: dict[Any, list[Timer]] = {}
            for t in timers.processing_time_timers():
                by_kg.setdefault(t.key, []).append(t)
            out: list[StoredElement] = []
            for kg, name, batch in found:
                elements = self.batches.elements(pa.Table.from_batches([batch]))
                for t in by_kg.pop(kg, ()):
                    row = t.namespace
                    if type(row) is not int or not 0 <= row < len(elements):
                        raise CheckpointError(
                            f"checkpoint file {name}: key group {kg}: a timeout timer names "
                            f"row {row!r} of {len(elements)}"
                        )
                    elements[row] = elements[row]._replace(deadline=t.timestamp)
                out += elements
            return pa.Table.from_batches([self.batches.to_batch(out, deadlines=True)])
        finally:
            timers.close()
            backend.close()

    # -- operator state (unkeyed elements; watermarks of earlier releases) ----------------
    def snapshot_operator(
        self, index: int, parallelism: int, elements: Sequence[StoredElement]
    ) -> list[Any]:
        """Partition ``index``'s operator state (``OperatorStateBackend.dump``), unkeyed:
        its elements as one record batch, deadlines inside (the watermarks are in the
        manifest)."""
        # none: empty bytes, as a partition that saw no input knows no input schema
        batch = b""
        if elements:
            batch = self.batches.dumps(self.batches.to_batch(elements, deadlines=True))
        return snapshot_operator_state(index, parallelism, None, batch)

    def restore_operator(
        self, index: int, parallelism: int, states: Sequence[tuple[str, list[Any]]], where: str
    ) -> tuple[WatermarkState, pa.Table | None]:
        """This partition's watermark state and share of the unkeyed elements: the old
        partition's batch at unchanged parallelism, else part ``index`` of all of them
        (in partition order) cut into ``parallelism`` near-equal parts. ``states``: every
        old partition's ``(file, operator state)``."""
        return restore_operator_state(index, parallelism, states, where, self.batches)


def make_backend(kind: str, max_parallelism: int, key_groups: KeyGroupRange) -> KeyedStateBackend:
    """A keyed state backend of ``kind`` (``"heap"`` or ``"rocksdb"``; RocksDB works in a
    new directory under the system's temp directory, deleted when the backend closes)."""
    if kind == "rocksdb":
        return RocksDBKeyedStateBackend(
            path=tempfile.mkdtemp(prefix="asyncio-ops-rocksdb-"),
            max_parallelism=max_parallelism,
            key_group_range=key_groups,
        )
    return HeapKeyedStateBackend(max_parallelism=max_parallelism, key_group_range=key_groups)


def snapshot_operator_state(
    index: int,
    parallelism: int,
    watermarks: WatermarkState | None,
    elements: bytes | None = None,
) -> list[Any]:
    """Partition ``index``'s operator state (``OperatorStateBackend.dump``): given
    ``elements`` (one record batch's bytes), its in-flight elements as the one item of
    the union list state ``"in-flight-batch"``; given ``watermarks``, the watermark
    state (union ``"watermark"``), as earlier releases wrote it (this one keeps it in
    the manifest and passes None)."""
    ops = OperatorStateBackend(index=index, parallelism=parallelism)
    if watermarks is not None:
        ops.get_union_list_state(WATERMARK, serializer=_Float2()).update([watermarks])
    if elements is not None:
        ops.get_union_list_state(IN_FLIGHT_BATCH, serializer=_BYTES).update([elements])
    return ops.dump()


def restore_operator_state(
    index: int,
    parallelism: int,
    states: Sequence[tuple[str, list[Any]]],
    where: str,
    batches: ElementBatchSerializer | None = None,
) -> tuple[WatermarkState, pa.Table | None]:
    """This partition's share of every old partition's operator state (``(file, state)``,
    in partition order): the highest watermark state of those that hold one (earlier
    releases; none: ``-inf``), and (with ``batches``) the table
    of its part of the in-flight elements (see :meth:`CarryOver.restore_operator`; None
    without ``batches`` or elements). ``where``: the checkpoint directory, for errors."""
    ops = OperatorStateBackend(index=index, parallelism=parallelism)
    items: list[bytes] = []
    try:
        ops.load([state for _, state in states])
        marks = ops.get_union_list_state(WATERMARK, serializer=_Float2()).get()
        if batches is not None and IN_FLIGHT_BATCH in ops.state_names():
            items = ops.get_union_list_state(IN_FLIGHT_BATCH, serializer=_BYTES).get()
    except (CheckpointError, StateError, ValueError, TypeError) as exc:
        raise CheckpointError(f"operator state in {where}: {exc}") from exc
    elements: pa.Table | None = None
    if batches is not None and items:
        if len(items) != len(states):
            raise CheckpointError(
                f"operator state in {where}: {len(items)} batches of in-flight elements "
                f"from {len(states)} partitions"
            )
        elements = _share(index, parallelism, items, batches, [name for name, _ in states])
    return WatermarkState.highest(marks), elements


def _share(
    index: int,
    parallelism: int,
    items: list[bytes],
    batches: ElementBatchSerializer,
    names: Sequence[str],
) -> pa.Table:
    """Part ``index`` of the old partitions' batches (each validated, the file named)."""
    mine = [index] if len(items) == parallelism else range(len(items))
    read: list[pa.RecordBatch] = []
    for old in mine:
        if not items[old]:  # a partition that carried nothing over
            continue
        try:
            read.append(batches.loads(items[old]))
        except CheckpointError as exc:
            raise CheckpointError(f"checkpoint file {names[old]}: {exc}") from exc
    if len(items) != parallelism:  # even split of all elements, in partition order
        total = sum(b.num_rows for b in read)
        base, extra = divmod(total, parallelism)
        start = index * base + min(index, extra)
        length = base + (1 if index < extra else 0)
        return batches.table(read).slice(start, length)
    return batches.table(read)
