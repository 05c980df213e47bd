"""Keyed mode: rows routed to partitions by key group, computed in the JVM.

The key group is ``pmod(hash(key columns), max_parallelism)`` with Spark's own
``hash()`` (Murmur3 x86_32, seed 42), carried into Python as the column
``__aops_key_group``: partitioning needs no Python and the runtime never
re-hashes. Partition ``i`` of ``P`` must hold exactly the key groups that
Flink's formula gives operator ``i`` (``kg * P // max_parallelism``), so that a
snapshot taken at ``P`` restores at another parallelism by key-group ranges.
``repartition(P, route)`` sends a row to ``pmod(hash(route), P)``; for each
``i`` we pick, once on the driver, an int ``route_i`` whose Spark hash lands on
``i`` and map each row's operator index to it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import cache
from typing import Final

import mmh3
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .._exceptions import ConfigurationError
from .._keygroups import HASH_SEED, check_parallelism
from .._runtime import KEY_GROUP_COLUMN

_ROUTE_COLUMN: Final = "__aops_route"
_pack_i = struct.Struct("<i").pack


@cache
def route_values(parallelism: int) -> tuple[int, ...]:
    """For each partition ``i``, the smallest int whose Spark ``hash()`` mod ``P`` is ``i``.

    Example:

    >>> from asyncio_ops.spark import route_values
    >>> route_values(4)  # Spark's hash(12) % 4 == 0, hash(6) % 4 == 1, ...
    (12, 6, 2, 0)
    """
    routes: list[int | None] = [None] * parallelism
    missing = parallelism
    candidate = 0
    while missing:
        p = mmh3.hash(_pack_i(candidate), HASH_SEED) % parallelism
        if routes[p] is None:
            routes[p] = candidate
            missing -= 1
        candidate += 1
    return tuple(r for r in routes if r is not None)


def key_group_column(key_cols: Sequence[str], max_parallelism: int) -> Column:
    return F.pmod(F.hash(*[F.col(c) for c in key_cols]), F.lit(max_parallelism))


def partition_by_key_group(
    df: DataFrame, key_cols: Sequence[str], max_parallelism: int, num_partitions: int | None
) -> tuple[DataFrame, int]:
    """``df`` with ``__aops_key_group``, repartitioned so partition i owns its key-group range
    (``max_parallelism`` checked with the operator's options)."""
    parallelism = num_partitions or int(
        df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200
    )
    if num_partitions is None and parallelism > max_parallelism:
        raise ConfigurationError(
            f"spark.sql.shuffle.partitions is {parallelism}, more partitions than "
            f"max_parallelism={max_parallelism} has key groups: pass num_partitions= (at "
            f"most {max_parallelism}), lower spark.sql.shuffle.partitions, or raise "
            "max_parallelism (it fixes the key groups: choose it before the first run)"
        )
    check_parallelism(max_parallelism, parallelism)
    routes = route_values(parallelism)
    df = df.withColumn(KEY_GROUP_COLUMN, key_group_column(key_cols, max_parallelism))
    operator_index = F.expr(f"int(({KEY_GROUP_COLUMN} * {parallelism}) div {max_parallelism})")
    route = F.element_at(F.array(*[F.lit(r) for r in routes]), operator_index + 1).cast("int")
    df = df.withColumn(_ROUTE_COLUMN, route).repartition(parallelism, _ROUTE_COLUMN)
    return df.drop(_ROUTE_COLUMN), parallelism
