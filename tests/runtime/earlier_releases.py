"""Checkpoint files as earlier releases wrote them, for the tests that they still read."""

from __future__ import annotations

import pyarrow as pa

from asyncio_ops._runtime._inflight import CarryOver, make_backend
from asyncio_ops._runtime._stored import StoredElement
from asyncio_ops._runtime._versions import _manifest_chains
from asyncio_ops._storage._container import Section
from asyncio_ops.state._keyed_snapshot import key_group_sections


def keyed_carry_over_as_earlier_releases_wrote(
    carry: CarryOver, elements: list[tuple[int, StoredElement]]
) -> dict[int, Section]:
    """The async operator's key-group sections (kind ``KEY_GROUPS``) as earlier releases
    wrote them: per key group, its elements as one record batch, the value of the
    ValueState ``in-flight-batch`` under the key group's own key, and each deadline a
    processing-time timer of that key whose namespace is the element's row."""
    backend = make_backend("heap", carry.max_parallelism, carry.key_groups)
    timers = carry._timers(backend)
    try:
        state = backend.get_state(carry._batch)
        by_kg: dict[int, list[StoredElement]] = {}
        for kg, e in elements:
            by_kg.setdefault(kg, []).append(e)
        for kg, group in by_kg.items():
            backend.assign_key_group(kg, kg)
            backend.set_current_key(kg)
            for row, e in enumerate(group):
                if e.deadline is not None:
                    timers.register_processing_time_timer(row, e.deadline)
            state.update(carry.batches.to_batch(group, deadlines=False))
        return {s.tag: s for s in key_group_sections(backend, timers)}  # before it closes
    finally:
        timers.close()
        backend.close()


def manifest_as_earlier_releases_wrote(manifest: pa.Table) -> pa.Table:
    """A manifest as earlier releases wrote it: a row per key group, its chain's
    ``(version, file, offset, length, size)`` as five lists, the same metadata."""
    chains = sorted(_manifest_chains(manifest, "manifest"))
    item = lambda t: pa.list_(pa.field("item", t, nullable=False))  # noqa: E731
    types = [pa.int64(), pa.string(), pa.int64(), pa.int64(), pa.int64()]
    names = ["versions", "files", "offsets", "lengths", "sizes"]
    fields = [pa.field("key_group", pa.int32(), nullable=False)]
    fields += [pa.field(n, item(t), nullable=False) for n, t in zip(names, types, strict=True)]
    columns = [pa.array([kg for kg, _ in chains], pa.int32())]
    columns += [
        pa.array([[link[i] for link in chain] for _, chain in chains], item(t))
        for i, t in enumerate(types)
    ]
    schema = pa.schema(fields, manifest.schema.metadata)
    return pa.Table.from_arrays(columns, schema=schema)
