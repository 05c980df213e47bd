"""Leases: what keeps the versions a reader reads from a running query's retention.

Contract. A lease is an empty file at the operator's directory, named
``lease-<from>-<until>-<id>``: the versions from ``<from>`` on (the oldest
version whose files the read needs: the oldest its key groups' chains name)
are kept until ``<until>`` (milliseconds since the epoch, wall clock). The
name is all it says: nothing in it is parsed but those two numbers.

- Retention (partition 0, ``asyncio_ops._runtime._retention``) consults the
  leases only when it is about to delete a version, from the one listing of
  the operator's directory that gives it the versions present. It never
  deletes a version at or after the ``<from>`` of a lease not yet expired, and
  deletes the lease files that have expired, or that end more than
  :data:`LONGEST` from now (no reader takes one that long: a clock far off, or a
  forged name, cannot keep files for ever).
- ``read_state`` (:func:`hold_versions`) takes a lease on every version from 0 before
  it lists the versions, so that no retention that starts while it reads the
  manifests deletes what it is about to pin; once pinned, it takes the
  lease on what the read needs and drops the first. A retention that had
  already listed the leases before the first was written deletes only versions
  older than every version the newest ``retain_versions`` need, and micro-batches
  run one after the other: the newest complete version, read by default, is
  never among them; an older version given explicitly may be, which the reader
  sees (:func:`missing`) and names.
- A reader that cannot write the lease (read-only access to the location)
  reads without one, logged: a version retention deletes before the read's
  tasks reach it then fails them, naming the file.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Final, TypeVar

from .._exceptions import CheckpointError
from .._storage._checkpoint_storage import CheckpointStorage

log = logging.getLogger("asyncio_ops.runtime")

T = TypeVar("T")

PREFIX: Final = "lease-"
_NAME: Final = re.compile(r"^lease-(\d{10})-(\d{13})-[0-9a-f]{32}$")
# no lease is taken for longer (seconds): 30 days; one that ends later is not honoured
LONGEST: Final = 30 * 86_400.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def lease_name(first: int, until_ms: int) -> str:
    return f"{PREFIX}{first:010d}-{until_ms:013d}-{uuid.uuid4().hex}"


def held_from(storage: CheckpointStorage, files: Iterable[str]) -> int | None:
    """The oldest version a lease among ``files`` (the names of the operator
    directory's files) still holds, None if none does; deletes the expired ones."""
    now = _now_ms()
    held: int | None = None
    for name in files:
        m = _NAME.match(name)
        if m is None:
            continue
        first, until = int(m[1]), int(m[2])
        if until <= now or until > now + int(LONGEST * 1000):
            storage.delete_marker(name)
            continue
        held = first if held is None else min(held, first)
    return held


def take(storage: CheckpointStorage, first: int, seconds: float) -> tuple[str, int] | None:
    """Lease the versions from ``first`` on for ``seconds``: the lease's name and its end
    (ms since the epoch), or None (logged) if the location is not writable here."""
    until = _now_ms() + int(min(seconds, LONGEST) * 1000)
    name = lease_name(first, until)
    try:
        storage.write_marker(name)
    except CheckpointError as exc:
        log.warning(
            "read_state reads %s without a lease (%s): a running query's retention may "
            "delete what it reads before its tasks do",
            storage.describe(storage.root),
            exc,
        )
        return None
    return name, until


def release(storage: CheckpointStorage, lease: tuple[str, int] | None) -> None:
    if lease is not None:
        storage.delete_marker(lease[0])


def missing(storage: CheckpointStorage, named: Iterable[int]) -> list[int]:
    """The versions among ``named`` no longer present (one listing)."""
    present = set(storage.versions())
    return sorted(set(named) - present)


def lease_expired_note(until_ms: int | None) -> str:
    """What a task adds to a read error once the read's lease has ended ('' before)."""
    if until_ms is None or _now_ms() < until_ms:
        return ""
    ended = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(until_ms / 1000))
    return (
        f"; read_state's lease on these versions ended at {ended}, after which the "
        "query's retention may delete them: call read_state again (or give a longer lease=)"
    )


def hold_versions(
    storage: CheckpointStorage,
    seconds: float,
    pin: Callable[[], T],
    needs: Callable[[T], Iterable[int]],
    newest: bool,
) -> tuple[T, int | None]:
    """What ``pin()`` opens (the versions a read reads, their manifests read), leased for
    ``seconds`` (0: no lease) on every version ``needs`` of it, and the lease's end (ms
    since the epoch; None: no lease). If a version it needs was deleted before the lease
    (module docstring), ``newest`` (the read asked for the newest version) pins again
    once, logged; otherwise a CheckpointError names the versions gone."""
    for attempt in (1, 2):
        # a location without versions gets no file: pin() names what is missing
        first = take(storage, 0, seconds) if seconds > 0 and storage.versions() else None
        lease = None
        try:
            found = pin()
            named = set(needs(found))
            if first is not None and named:
                lease = take(storage, min(named), seconds)
        finally:
            release(storage, first)
        gone = missing(storage, named)
        if not gone:
            return found, None if lease is None else lease[1]
        release(storage, lease)
        where = storage.describe(storage.root)
        if not newest or attempt == 2:
            raise CheckpointError(
                f"read_state: {where} no longer holds version(s) {gone} that the version "
                "read needs: the query's retention (retain_versions) deleted them before "
                "read_state could lease them; read a newer version"
            )
        log.warning(
            "read_state: %s lost version(s) %s while pinned; pinning the newest again", where, gone
        )
    raise AssertionError("unreachable")


@contextmanager
def lease_noted(until_ms: int | None) -> Iterator[None]:
    """Run a read of leased versions: a CheckpointError it raises after the lease ended
    says so (:func:`lease_expired_note`)."""
    try:
        yield
    except CheckpointError as exc:
        if note := lease_expired_note(until_ms):
            raise CheckpointError(f"{exc}{note}") from exc
        raise
