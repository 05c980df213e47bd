"""Whose state a streaming version is: the query that wrote it and the uid that claims it.

Each manifest records the streaming query that wrote it (``sql.streaming.queryId``,
the same across restarts of one query from its Spark checkpoint;
``_versions.write_version``). Before a micro-batch reads or writes, :func:`claim`
refuses another query's state, and a restore that would leave this query's state
unclaimed under another uid (Flink's ``allowNonRestoredState``).
"""

from __future__ import annotations

from .._exceptions import CheckpointError
from .._storage._checkpoint_storage import CheckpointStorage
from .._storage._container import Kind
from ._versions import VersionFiles, query_of

__all__ = ["claim"]


def claim(
    storage: CheckpointStorage,
    version: int,
    query: str | None,
    previous: VersionFiles | None,
    allow_non_restored_state: bool = True,
) -> None:
    """Whose state this is, checked before a streaming micro-batch ``version`` of query
    ``query`` (its ``sql.streaming.queryId``; None: unknown, nothing checked) restores
    ``previous`` (None: the operator has no version):

    - a version another query wrote is that query's state: CheckpointError naming both
      ids (two queries given one location and uid, in turn or in other applications);
    - micro-batch 0 of a query whose uid holds another query's versions: the same;
    - micro-batch N > 0 (the query restores: its Spark checkpoint committed batches)
      with no version of this uid, while the location holds the state of other uids
      this query wrote (or whose writer is not recorded): the state would be left
      unclaimed, which is what a changed default uid looks like (a class renamed, a
      key changed), so it is refused naming the uids found, unless
      ``allow_non_restored_state`` (Flink's name): the operator then starts empty.
    """
    if query is None:
        return
    if previous is not None:
        wrote = previous.query()
        if wrote is not None and wrote != query:
            raise _foreign(storage, wrote, query)
        return
    if version == 0:
        held = storage.versions()
        wrote = _writer(storage, held[-1]) if held else None
        if wrote is not None and wrote != query:
            raise _foreign(storage, wrote, query)
        return
    if allow_non_restored_state:
        return
    unclaimed = []
    for uid in storage.other_uids():
        other = CheckpointStorage(storage.location, uid)
        held = other.versions()
        if held and _writer(other, held[-1], "") in ("", query):
            unclaimed.append(uid)
    if unclaimed:
        where = storage.describe(storage.root)[: -len(storage.uid)]
        raise CheckpointError(
            f"micro-batch {version} restores from {where}, which holds no state for uid "
            f"{storage.uid!r} but holds this query's state for uid(s) {unclaimed}: "
            "starting empty would leave that state behind (a default uid changes with "
            "the function's class name, its key or the operator's options). "
            f"Pin the operator to its state with uid={unclaimed[0]!r} (and keep uid= from "
            "now on), or start it empty on purpose with allow_non_restored_state=True"
        )


def _writer(storage: CheckpointStorage, version: int, unknown: str | None = None) -> str | None:
    """The query that wrote ``version``, as one of its manifests names it (a version being
    written may hold some only); ``unknown`` when none names one (or none is there)."""
    for name in storage.list_files(version, "subtask-")[:1]:
        manifest = storage.read_if_present(version, name, Kind.MANIFEST)
        wrote = query_of(manifest) if manifest is not None else None
        return wrote or unknown
    return unknown


def _foreign(storage: CheckpointStorage, wrote: str, query: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint_location {storage.describe(storage.root)} (uid {storage.uid!r}) holds the "
        f"state of streaming query {wrote}, not of this query ({query}): two queries never "
        "share one state. Give this query its own checkpoint_location or uid=; a query "
        "restarted from its own Spark checkpoint keeps its id and its state"
    )
