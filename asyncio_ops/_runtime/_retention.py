"""Retention: which versions of a streaming operator's state to delete, and deleting them.

Contract. Partition 0's task of version ``N`` keeps, once ``N`` is written,
the newest ``retain_versions`` versions and every older version directory
their chains name (``asyncio_ops._runtime._versions``), and deletes the
rest. It finds the oldest version to keep without reading manifests: it
lists the oldest retained version, whose key-group files' names say the
oldest version their partition's chains name (``kg-p<i>-<token>-from<v>``;
chains only move forward, so later versions name nothing older; of two
attempts the least is kept, so a failed attempt that restarted a chain never
hides what the manifest in force names; a partition whose files do not say,
from earlier releases, has its manifest read). ``keyed_process`` records in
partition 0's manifest the version before which every version is deleted
(``KEPT_FROM``): while the oldest version to keep is not past the one its
previous manifest records, there is nothing to delete and nothing is listed.
The async operator's versions hold their elements whole: it keeps exactly the
newest ``retain_versions``. Before deleting, one listing of the operator's
directory gives the versions present and the readers' leases
(``asyncio_ops._runtime._leases``): no version a lease holds is deleted.

A ``keyed_process`` version older than the newest ``retain_versions`` stays
only for the files its successors' chains name: it is never restored again,
so each partition, after writing version ``N``, deletes its own manifest of
version ``N - max(retain_versions, PARK_EVERY)`` (:func:`drop_manifest`; a
parked RocksDB copy up to ``PARK_EVERY`` versions old proves itself against
its version's manifest, ``_parked``). Not on an object store (S3, GCS): there
pyarrow deletes a file in three requests (a HEAD, the DELETE, a PUT of the
directory's marker), half again a micro-batch's requests, to save a few KB
that the version directory's deletion takes with it later. A restore or
``read_state`` of such a version finds no manifest, and its error says why.

On a remote store (S3, GCS, HDFS) partition 0's retention runs beside its
task, not after it (:class:`Retention`): the listing and the deletion start
when the task does (``keyed_process``: after it has proven any state it kept
from an earlier version, which reads that version's manifest; the async
operator: once it has restored), while it restores, processes and writes.
Deleting before the manifest of ``N`` is written is safe: what is deleted is
older than every version the newest ``retain_versions`` need
(``retain_versions >= 2``, so ``N - 1``, the one restored, among them),
whether or not ``N`` commits; an attempt of ``N`` that fails after the
deletion leaves partition 0's manifest of ``N - 1`` in force, whose
``KEPT_FROM`` is older, and its next attempt deletes the same versions again
(already gone: nothing to do).
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

from .._storage._checkpoint_storage import CheckpointStorage
from .._storage._container import Kind
from ._leases import held_from
from ._versions import concurrently, manifest_name

log = logging.getLogger("asyncio_ops.runtime")

# keyed_process, partition 0's manifest: every version before it was deleted
KEPT_FROM: Final = b"aops.kept_from"


def _plan(
    storage: CheckpointStorage, version: int, retain: int, chained: bool,
    deleted_before: int | None,
) -> tuple[int, list[int] | None]:  # fmt: skip
    """The oldest version to keep once ``version`` is written, and the versions present
    if they were listed (None: nothing to delete, nothing listed). Of the newest
    ``retain``, the oldest, or (``chained``: ``keyed_process``, whose chains may name
    earlier versions) the oldest their chains name; the async operator's versions hold
    their elements whole. When that would delete a version, one listing of the operator's
    directory gives the versions and the readers' leases (``_leases``): none at or after
    a lease's first version is deleted."""
    keep = retained_from(storage, version, retain) if chained else version - retain + 1
    if keep <= 0 or (deleted_before is not None and keep <= deleted_before):
        return keep, None
    present, files = storage.root_listing()
    held = held_from(storage, files)
    if held is not None and held < keep:
        log.info("retention of %s keeps versions from %s on: a reader's lease holds them "
                 "(else from %s)", storage.describe(storage.root), held, keep)  # fmt: skip
        keep = held if deleted_before is None else max(held, deleted_before)
    return keep, present


class Retention:
    """Partition 0's retention of the version ``version`` it writes: the oldest version
    to keep (``keyed_process``: :func:`retained_from`, recorded in its manifest as
    ``KEPT_FROM``; ``chained=False``, the async operator: the newest ``retain``) and the
    deletion of those before it (:func:`delete_before`; ``deleted_before``: the
    ``KEPT_FROM`` of its manifest of the version restored, if it says).

    Call order: construct it when the task starts (after any proof of state kept from
    an earlier version), ``keep_from()`` before the manifest is written, ``join()``
    once the version is written (the deletion done, its error raised), and
    ``abandon()`` when the task ends, whatever happened (after a ``join()`` it does
    nothing; otherwise the task failed, and its error is the one raised). On a remote
    store the listing and then the deletion run in a thread of their own from the
    constructor on (module docstring), which both wait for, so none outlives the task;
    elsewhere ``keep_from()`` lists and ``join()`` deletes, in line."""

    def __init__(
        self,
        storage: CheckpointStorage,
        version: int,
        retain: int,
        deleted_before: int | None,
        chained: bool = True,
    ) -> None:
        self._storage = storage
        self._version = version
        self._retain = retain
        self._chained = chained
        self._deleted_before = deleted_before
        self._ended = False
        self._listed: Future[tuple[int, list[int] | None]] = Future()
        self._done: Future[None] | None = None
        if storage.remote:
            pool = ThreadPoolExecutor(1, thread_name_prefix="aops-retention")
            self._done = pool.submit(self._run)
            pool.shutdown(wait=False)  # the thread ends with _run

    def _run(self) -> None:
        try:
            plan = self._plan()
        except BaseException as exc:  # keep_from() raises it
            self._listed.set_exception(exc)
            return
        self._listed.set_result(plan)
        delete_before(self._storage, *plan)

    def _plan(self) -> tuple[int, list[int] | None]:
        return _plan(self._storage, self._version, self._retain, self._chained,
                     self._deleted_before)  # fmt: skip

    def keep_from(self) -> int:
        """The oldest version kept once ``version`` is written (the listing's error if it
        failed)."""
        if self._done is None and not self._listed.done():  # in line: listed once
            self._listed.set_result(self._plan())
        return self._listed.result()[0]

    def join(self) -> None:
        """Wait for the deletion (remote) or delete (elsewhere); its error, if any."""
        self._ended = True
        if self._done is not None:
            self._listed.result()
            self._done.result()
        else:
            self.keep_from()
            delete_before(self._storage, *self._listed.result())

    def abandon(self) -> None:
        """The task ends: if it failed before ``join()``, wait for the thread, if any
        (what it deleted is safe to have deleted: module docstring), and log its error,
        as the task's is the one raised; elsewhere delete nothing."""
        if self._ended:
            return
        self._ended = True
        if self._done is not None:  # once the thread is done, its listing is too
            exc = self._done.exception() or self._listed.exception()
            if exc is not None:
                log.warning("retention of version %s failed too: %r", self._version, exc)


def drop_manifest(storage: CheckpointStorage, version: int, partition: int, kept: int) -> None:
    """Delete ``partition``'s manifest of the version ``kept`` before ``version`` (which
    it has just written), if there is one: that version is no longer restored (module
    docstring); not on an object store."""
    if version - kept >= 0 and not storage.object_store:
        storage.delete_file(version - kept, manifest_name(partition))


def retained_from(storage: CheckpointStorage, version: int, retain: int) -> int:
    """The oldest version to keep once ``version`` is written: of the newest ``retain``,
    the oldest, or the oldest its chains name (0 while there are no more)."""
    oldest = version - retain + 1
    return _oldest_named(storage, oldest) if oldest > 0 else 0


def delete_before(storage: CheckpointStorage, keep_from: int, present: list[int] | None) -> None:
    """Delete the versions older than ``keep_from`` among ``present`` (as
    :func:`_plan` listed them; None: nothing to delete)."""
    if present is not None:
        storage.delete_versions([v for v in present if v < keep_from])


_FLOOR_NAME: Final = re.compile(r"^kg-p(\d+)-.+-from(\d+)\.ckpt$")
_MANIFEST_NAME: Final = re.compile(r"^subtask-(\d+)\.ckpt$")


def _oldest_named(storage: CheckpointStorage, version: int) -> int:
    """The oldest version the chains of ``version``'s manifests name (``version`` if
    none), and so of every later version's (a chain only moves forward): from one
    listing of the version, whose key-group files name it (``kg-p<i>-<token>-from<v>``,
    written by every attempt before its manifest, so the least of them is at most the
    manifest in force's); a partition's manifest is read only if no file of it says
    (earlier releases)."""
    floors: dict[int, int] = {}
    partitions = []
    for name in storage.list_files(version):
        if m := _FLOOR_NAME.match(name):
            floors[int(m[1])] = min(floors.get(int(m[1]), version), int(m[2]))
        elif m := _MANIFEST_NAME.match(name):
            partitions.append(int(m[1]))
    oldest = min(floors.values(), default=version)
    unsaid = [p for p in partitions if p not in floors]
    read = lambda p: storage.read_if_present(version, manifest_name(p), Kind.MANIFEST)  # noqa: E731
    for manifest in concurrently(storage, read, unsaid):
        if manifest is not None and "versions" in manifest.column_names:
            for vs in manifest.column("versions").to_pylist():
                if vs:
                    oldest = min(oldest, min(vs))
    return oldest
