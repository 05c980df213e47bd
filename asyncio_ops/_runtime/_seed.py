"""Initial state of ``keyed_process``: a seed written before the first micro-batch.

Contract:

- :func:`write_seed` runs in one task of a Spark job over the initial-state
  DataFrame, routed by the same key groups as the input (``__aops_key_group``):
  it opens the :class:`KeyedProcessFunction` on a fresh backend of the job's
  kind over the task's key groups, calls the seeding function once per key
  with all of that key's initial rows (``fn(key, rows, ctx)``, the key current,
  so the function's state handles and ``ctx.timer_service()`` act on it), and
  writes every non-empty key group's full section into one file of the run
  directory :data:`SEED` of the operator's checkpoint, then a manifest of its
  own (``seed-manifest-p<i>``: key group, file, offset, length, size). Two
  attempts of one task write different section files; the manifest written
  last wins.
- :func:`restore_seed` (a micro-batch 0, or a batch job) reads every seed
  manifest and applies the sections of the partition's key groups through the
  readers a restore uses (``_versions.read_chains``), before ``open``.
- The driver deletes an old seed before writing a new one and writes a seed
  only while the operator has no streaming version: a query that restores from
  a version never reads the seed. Version 0 then holds the key groups' full
  state, so nothing after it names the seed.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import pyarrow as pa

from .._engine._keyed_operator import KeyedProcessOperator
from .._exceptions import CheckpointError
from .._functions import RuntimeContext
from .._keygroups import compute_key_group_range_for_operator_index
from .._storage._checkpoint_storage import CheckpointStorage
from .._storage._container import Kind
from ..state import KeyedProcessContext
from ..state._keyed_snapshot import key_group_sections
from ._inflight import make_backend
from ._spec import KEY_GROUP_COLUMN, KeyedProcessSpec, TaskInfo, key_selector
from ._versions import Chain, apply_chains, key_group_prefix, noted_full

SEED: Final = "initial-state"
_MANIFEST_PREFIX: Final = "seed-manifest-"
_SCHEMA: Final = pa.schema(
    [
        pa.field("key_group", pa.int32(), nullable=False),
        pa.field("file", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
    ]
)

InitialStateFn = Callable[[Any, list[dict[str, Any]], KeyedProcessContext], None]


def write_seed(
    spec: KeyedProcessSpec,
    seed_fn: InitialStateFn,
    batches: Iterable[pa.RecordBatch],
    task: TaskInfo,
) -> Iterator[pa.RecordBatch]:
    """Seed this task's key groups from its initial rows; yields one row: the keys seeded."""
    storage = spec.checkpoint
    assert storage is not None
    p = task.num_partitions or 1
    key_groups = compute_key_group_range_for_operator_index(
        spec.options.max_parallelism, p, task.partition_id
    )
    backend = make_backend(spec.options.state_backend, spec.options.max_parallelism, key_groups)
    op = KeyedProcessOperator(
        spec.function, key_selector(spec.key), backend=backend, output=lambda _: None,
        schedule_timers=False,
        runtime_context=RuntimeContext(
            task_name="keyed_process initial state", index_of_this_subtask=task.partition_id,
            number_of_parallel_subtasks=p, attempt_number=task.attempt_number,
        ),
    )  # fmt: skip
    key_of = key_selector(spec.key)
    rows: dict[Any, tuple[int, list[dict[str, Any]]]] = {}
    for batch in batches:
        for row in batch.to_pylist():
            kg = row.pop(KEY_GROUP_COLUMN)
            rows.setdefault(key_of(row), (kg, []))[1].append(row)
    try:
        op.open()
        ctx = op._ctx
        for key, (kg, key_rows) in rows.items():
            backend.assign_key_group(key, kg)
            backend.set_current_key(key)
            try:
                seed_fn(key, key_rows, ctx)
            except Exception as exc:
                exc.add_note(
                    f"keyed_process initial_state_fn: key {key!r:.100}, "
                    f"{len(key_rows)} initial row(s), the first {key_rows[0]!r:.200}"
                )
                raise
        sections = key_group_sections(backend, op.timer_service)  # one at a time
        writer = uuid.uuid4().hex[:12]
        groups: list[int] = []
        name = f"{key_group_prefix(task.partition_id)}{writer}.ckpt"
        first = next(sections, None)
        extents = (
            storage.write_sections(
                SEED, name, Kind.KEY_GROUPS,
                noted_full(itertools.chain([first], sections), {}, groups),
            )
            if first is not None
            else []
        )  # fmt: skip
        manifest = pa.table(
            {
                "key_group": groups,
                "file": [name] * len(groups),
                "offset": [e[0] for e in extents],
                "length": [e[1] for e in extents],
                "size": [e[2] for e in extents],
            },
            schema=_SCHEMA,
        )
        storage.write(SEED, f"{_MANIFEST_PREFIX}p{task.partition_id:05d}.ckpt", Kind.MANIFEST,
                      manifest)  # fmt: skip
    finally:
        op.close()
        backend.close()
    yield pa.RecordBatch.from_pydict({"keys": [len(rows)]})


def clear_seed(storage: CheckpointStorage) -> None:
    """Delete the operator's seed (if any), before writing a new one."""
    storage.delete_versions([SEED])


def seed_chains(storage: CheckpointStorage, op: KeyedProcessOperator) -> None:
    """Apply the seed's sections of ``op``'s key groups (before ``open``); CheckpointError
    naming the file if the seed is damaged."""
    kgr = op.backend.key_group_range
    chains: dict[int, Chain] = {}
    for name in storage.list_files(SEED, _MANIFEST_PREFIX):
        path = storage.path(SEED, name)
        table = storage.read(SEED, name, Kind.MANIFEST)
        if not table.schema.remove_metadata().equals(_SCHEMA):
            raise CheckpointError(
                f"checkpoint file {path} has the columns {table.schema.names}, not {_SCHEMA.names}"
            )
        cols = table.to_pydict()
        for kg, file, offset, length, size in zip(
            cols["key_group"], cols["file"], cols["offset"], cols["length"], cols["size"],
            strict=True,
        ):  # fmt: skip
            if kg in kgr:
                # the seed is a run directory: its links name it where a version would be
                chains[kg] = ((SEED, file, offset, length, size),)  # type: ignore[assignment]
    apply_chains(storage, chains, op.apply_change)
