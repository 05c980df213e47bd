"""The driver's preflight: a function checks what it can once, before any Spark job.

``ordered_wait``, ``unordered_wait`` (and with them ``AsyncDataStream``) and
``keyed_process`` call :func:`preflight` on the driver after their own option
checks and before they build the plan, unless given ``preflight=False``. A
function that implements :class:`asyncio_ops.SupportsPreflight` (the
connectors do) then runs ``preflight(context)`` once, with a
:class:`asyncio_ops.PreflightContext` of the Arrow schemas of the input rows
and of the declared output columns: a ``PostgresLookup`` connects,
authenticates and prepares its query (its result columns against the key and
the output columns, without running it), an ``HttpLookup`` reaches its
endpoint (see docs/connectors.md). Functions without the method (a plain
``async def``) have nothing to check.

The hook runs on an event loop of its own, created and closed around it on a
helper thread (the caller's thread keeps its own loop, running, as a
notebook's, or not), so nothing it opens outlives the call. An exception it raises
propagates unchanged, the library's own for the connectors
(``asyncio_ops.connectors.LookupAuthError``, ``LookupQueryError``, ...), with
a note naming the function and saying that the check ran on the driver before
any job and that ``preflight=False`` skips it. No Spark job has started when
it is raised: the DataFrame is not built.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from .._exceptions import ConfigurationError
from .._functions import (
    CoroutineFunction,
    PreflightContext,
    SupportsPreflight,
    maybe_await,
)


def preflight(enabled: object, function: object, df: DataFrame, output: StructType) -> None:
    """Run ``function``'s preflight against ``df``'s rows and the declared ``output``
    columns, if ``enabled`` (the ``preflight`` option) and the function has one."""
    if not isinstance(enabled, bool):
        raise ConfigurationError(f"preflight must be True or False, got {enabled!r}")
    if not enabled:
        return
    target = function.fn if isinstance(function, CoroutineFunction) else function
    if not isinstance(target, SupportsPreflight):
        return
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    context = PreflightContext(
        input_schema=to_arrow_schema(df.schema, timezone=timezone),
        output_schema=to_arrow_schema(output, timezone=timezone),
    )
    try:
        _run_alone(lambda: maybe_await(target.preflight(context)))
    except Exception as exc:
        exc.add_note(
            f"raised by the preflight of {target!r} on the driver, before any Spark job "
            "(preflight=False skips it)"
        )
        raise


def _run_alone(make: Any) -> Any:
    """Run the coroutine ``make()`` on a loop of its own, on a thread of its own: the
    caller's thread keeps its loop, running (a notebook's) or not; its result."""
    with ThreadPoolExecutor(1, thread_name_prefix="asyncio_ops-preflight") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
