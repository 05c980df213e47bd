"""Where an operator's checkpoint lives, checked on the driver, and whose it is.

- The location (:func:`checkpoint_storage`): a path or URI string every
  executor reaches (a plain path under a master whose executors run on other
  machines is refused, :func:`unshared_location`), writable.
- The operator's id (``uid``): given, or derived from what makes the operator
  (:func:`default_uid`), so a restarted query finds its own checkpoint.
- One owner per location and id: every operator that keeps a checkpoint names
  its ``mapInArrow`` function after :func:`plan_tag`, so a second operator
  under the same location and id, upstream in the plan or in another running
  query of the session, is refused naming the first (:data:`DESCRIBED`).
- A batch run's name starts with :func:`run_epoch` (the application's start),
  so runs sort in the order they ran.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from .._exceptions import ConfigurationError
from .._functions import AsyncFunction, CoroutineFunction
from .._storage._checkpoint_storage import CheckpointStorage, shown_location
from ..options import OutputMode


def _spark_context(spark: SparkSession) -> SparkContext | None:
    """The session's SparkContext; None on Spark Connect, whose client has none."""
    try:
        return spark.sparkContext
    except (AttributeError, NotImplementedError):
        return None


def run_epoch(spark: SparkSession) -> int:
    """Milliseconds that lead a batch run's name (see PartitionSpec): the application's
    start, so that runs of one application sort by execution id; the current time
    where the session has no SparkContext (Spark Connect)."""
    context = _spark_context(spark)
    return int(context.startTime) if context is not None else int(time.time() * 1000)


DESCRIBED: dict[str, str] = {}
"""Plan tag -> description of the operator, for the message of a uid collision."""


def _function_name(function: AsyncFunction[Any, Any], module: bool = True) -> str:
    target: Any = function.fn if isinstance(function, CoroutineFunction) else type(function)
    name = getattr(target, "__qualname__", repr(target))
    return f"{getattr(target, '__module__', '?')}.{name}" if module else str(name)


def default_uid(
    mode: OutputMode,
    function: AsyncFunction[Any, Any],
    added: StructType,
    key_cols: Sequence[str],
    event_col: str | None,
    input_schema: StructType,
) -> str:
    """The operator id when ``uid`` is not given: stable across restarts of one query.

    Derived from what makes the operator itself (mode, function's name without
    its module, output columns, key, event time, input columns, whose rows its
    carried-over elements hold), so that two different operators
    under one ``checkpoint_location`` get different ids, and the same operator
    rebuilt after a restart finds its checkpoint. Two identical operators in
    one query would share it: give them ``uid=`` each (an operator upstream
    of another with the same id is refused, see :func:`_check_not_upstream`).
    """
    parts = [
        mode.value, _function_name(function, module=False), added.simpleString(),
        ",".join(key_cols),
        event_col or "", input_schema.simpleString(),
    ]  # fmt: skip
    digest = hashlib.blake2b("|".join(parts).encode(), digest_size=6).hexdigest()
    return f"{mode.value.replace('_', '-')}-wait-{digest}"


def plan_tag(location: str, uid: str) -> str:
    digest = hashlib.blake2b(f"{location.rstrip('/')}|{uid}".encode(), digest_size=8).hexdigest()
    return f"asyncio_ops_{digest}"


def describe_operator(mode: OutputMode, function: AsyncFunction[Any, Any], token: str) -> str:
    return f"{mode.value} wait of {_function_name(function)} (DataFrame {token})"


def checkpoint_storage(df: DataFrame, location: object, uid: str) -> CheckpointStorage:
    """The checkpoint storage of an operator (``uid``) under ``location``, checked on the
    driver: a path or URI string, reachable by every executor
    (:func:`unshared_location`), writable, and not already an operator's of this plan
    or of a running query (:func:`_check_not_upstream`)."""
    if not isinstance(location, str) or not location:
        raise ConfigurationError(
            f"checkpoint_location must be a path or URI string, got {location!r}"
        )
    problem = unshared_location(location, _master(df.sparkSession))
    if problem is not None:
        raise ConfigurationError(problem)
    storage = CheckpointStorage(location, uid)
    storage.check_writable()
    _check_not_upstream(df, location, uid)
    return storage


def _master(spark: SparkSession) -> str | None:
    """The session's master URL (None where the client cannot tell: Spark Connect)."""
    context = _spark_context(spark)
    return str(context.master) if context is not None else None


def unshared_location(location: str, master: str | None) -> str | None:
    """Why ``location`` cannot hold checkpoints under ``master``, or None.

    A plain path (no ``scheme://``) is a directory of whichever machine reads it:
    with a master whose executors run on other machines (``spark://``, ``yarn``,
    ``k8s://``, ...) each executor would write its own disk, and the next
    micro-batch or retry, elsewhere, would find no state. Local masters
    (``local``, ``local[N]``, ``local-cluster[...]``) run on one machine, and an
    explicit ``file://`` URI is the user's word that the path is shared (a mount
    every executor has).
    """
    if "://" in location or master is None or master.startswith("local"):
        return None
    return (
        f"checkpoint_location {location!r} is a local path, but the master {master!r} "
        "runs executors on other machines, whose disks do not share it: one executor's "
        "state would be invisible to the next. Use storage every executor reaches "
        "(s3://..., gs://..., abfs://..., hdfs://...), or, if every executor mounts this "
        f"path, say so with file://{os.path.abspath(location)}"
    )


def _check_not_upstream(df: DataFrame, location: str, uid: str) -> None:
    """Refuse a second operator under one location and uid: in the same query (upstream in
    ``df``'s plan), or in another streaming query running in this session.

    Every operator that keeps a checkpoint names its mapInArrow function after
    :func:`plan_tag` of its location and uid, so the tag in a plan is the
    ownership record. A query restarted from its own Spark checkpoint is built
    after the old run stopped, so it finds no running owner and goes on.
    """
    tag = plan_tag(location, uid)
    try:
        plan = df._jdf.queryExecution().logical().toString()
    except Exception:  # Spark Connect: no JVM plan to read; the default ids still differ
        return
    if tag in plan:
        raise ConfigurationError(
            f"two operators write checkpoint_location {shown_location(location)!r} with uid "
            f"{uid!r}: "
            f"{DESCRIBED.get(tag, 'an operator upstream')} is already in this DataFrame's "
            "plan; give each operator its own uid="
        )
    for query in df.sparkSession.streams.active:
        if tag in _query_plan(query):
            raise ConfigurationError(
                f"checkpoint_location {shown_location(location)!r} with uid {uid!r} is in use by "
                f"{DESCRIBED.get(tag, 'an operator')} of the running streaming query "
                f"{query.name or '(unnamed)'!r} (id {query.id}); a query of this DataFrame "
                "would share its state and checkpoint versions: pass distinct uid= or "
                "checkpoint_location= to the operators of the two queries"
            )


def _query_plan(query: StreamingQuery) -> str:
    """The logical plan of a running streaming query, as text ('' if Spark hides it)."""
    try:
        return str(query._jsq.streamingQuery().logicalPlan().toString())
    except Exception:  # Spark Connect, or a query that stopped meanwhile
        return ""
