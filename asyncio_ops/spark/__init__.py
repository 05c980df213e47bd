"""The Spark DataFrame API of asyncio_ops (the only package that imports pyspark).

``ordered_wait`` / ``unordered_wait`` follow Flink's ``AsyncDataStream`` and
PyFlink's names (``AsyncDataStream`` keeps PyFlink's argument order, for
porting, and ``Time`` PyFlink's durations); ``keyed_process`` runs a
``KeyedProcessFunction`` with keyed state and timers (Flink's
``KeyedProcessOperator``), and ``read_state`` reads its checkpoint's state as
a DataFrame; ``register`` makes a lookup a function of Spark SQL,
``register_table`` a table function; ``lookup_join``
joins a lookup per row, per distinct key or by a bulk read, whichever is cheapest;
``session()`` builds a SparkSession whose Python workers run this interpreter;
``AsyncMetrics`` collects operator metrics across tasks. A job failed by an
asyncio_ops exception raises that exception, Spark's as its cause
(``library_errors()`` where that cannot reach: a Spark Connect client); the
function's preflight runs before any job.
"""

from __future__ import annotations

from .._runtime import KEY_GROUP_COLUMN
from ._api import ordered_wait, unordered_wait
from ._datastream import AsyncDataStream
from ._job_errors import library_error, library_errors
from ._keyed import route_values
from ._keyed_process import keyed_process
from ._lookup_join import lookup_join
from ._metrics import AsyncMetrics
from ._read_state import read_state
from ._session import session
from ._sql import register
from ._sql_table import register_table
from ._time import Time

__all__ = [
    "KEY_GROUP_COLUMN",
    "AsyncDataStream",
    "AsyncMetrics",
    "Time",
    "keyed_process",
    "library_error",
    "library_errors",
    "lookup_join",
    "ordered_wait",
    "read_state",
    "register",
    "register_table",
    "route_values",
    "session",
    "unordered_wait",
]
