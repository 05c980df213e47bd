"""``lookup_join``: a lookup as a join, paid per row, once per distinct key, or by a bulk read.

Contract. ``lookup_join(df, lookup, timeout=..., output_schema=..., strategy=,
how=, ...)`` returns a DataFrame whose rows equal, as a multiset, those of
``ordered_wait(df, lookup, ...)`` with the same options and ``on_empty="keep"``
(``how="left"``) or ``"drop"`` (``how="inner"``): the input's columns, then
``output_schema``'s, then ``_error`` with ``on_error="error_column"``; a NULL
key matches nothing, a key without a match keeps its row with NULL output
columns (left) or drops it (inner), a one-to-many answer gives one row per
match, an error row's error reaches every input row of its key. No order is
promised (a join's). Only the cost differs:

- ``"rows"``: ``ordered_wait`` over ``df`` itself, each row looked up;
- ``"distinct"``: the distinct non-NULL keys of ``df`` (the columns of the
  lookup's ``request_fields()``) looked up once each by ``ordered_wait`` (the
  same capacity, retries, limits, caches, metrics), joined back on them;
- ``"bulk"``: every key the lookup answers, listed by the lookup in parts
  (``bulk_keys``, a ``PostgresLookup`` with ``table=``: its table's keys), read
  by one Spark task each and looked up by ``ordered_wait``, then joined: a
  snapshot of the table as the job reads it;
- ``"auto"``: the cheapest by :func:`choose` (the cost model, documented in
  docs/lookup-join.md) from estimates made in this order, each only when the
  choice still depends on it: the table's rows and bytes (the lookup's
  ``table_statistics()``, for a lookup that can read in bulk); the input's rows
  from Spark's plan statistics (no job); when the table has fewer rows than
  that, the service's rate from a probe of the table's own keys on the driver
  (``bulk_keys``, no Spark job), and ``"bulk"`` is chosen without reading the
  input when it costs less than ``"rows"`` and than ``"distinct"`` with no
  lookups at all (its aggregation and join alone); otherwise the input's rows
  and distinct keys (one Spark job: ``count`` and ``approx_count_distinct``
  over the key columns) and, unless given (``rate=``) or already probed, the
  rate from a probe on the driver of ``probe_keys`` of the input's keys, timed,
  times the cluster's task slots.

One module with one job, ``lookup_join``: its choice of strategy (the estimates, the
cost model, the explanation) and the plan of the strategy chosen.

What a lookup can do, it declares (``join_strategies()``, the connector base's):
a function without it is joined ``"rows"``; a streaming DataFrame too (each
micro-batch is a batch DataFrame inside ``foreachBatch``, where ``distinct``
runs), and a join with the options that only the per-row operator has
(checkpoints, event time, per-key order).

Call order on the driver: the keywords are checked (``strategy``, ``how``, then
every option by ``ordered_wait``, which builds the per-row plan and runs the
lookup's preflight once); the strategy is chosen (``auto``: the estimates'
queries, probe and job, those it needs, run now); its plan is built; the choice is logged at INFO on
``asyncio_ops.spark`` (the record's ``lookup_join`` attribute holds the
:class:`JoinChoice`) and printed with ``explain=True``. Nothing else runs until
an action. The broadcast hint is given when the estimated lookup side is at
most ``broadcast_threshold`` bytes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from copy import deepcopy
from dataclasses import dataclass, field, replace
from functools import partial, reduce
from typing import Any, Final, Protocol, runtime_checkable

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from .._exceptions import ConfigurationError
from .._functions import RuntimeContext, SupportsInvokeArrow, as_async_function, maybe_await
from .._runtime import ERROR_COLUMN
from ..options import DEFAULT_CAPACITY, choice, positive_int
from ._api import chunk_rows_of, default_capacity, ordered_wait
from ._frame import batch_size_of
from ._keywords import known_keywords
from ._options import WAIT_SIGNATURE, WaitOptions
from ._preflight import _run_alone

__all__ = ["JoinChoice", "JoinEstimates", "choose", "lookup_join"]

log = logging.getLogger("asyncio_ops.spark")

STRATEGIES: Final = ("auto", "rows", "distinct", "bulk")
HOWS: Final = ("left", "inner")
ROWS_ONLY: Final = frozenset({
    "checkpoint_location", "checkpoint_version", "checkpoint_flush_rows",
    "checkpoint_flush_interval", "drain_timeout", "state_backend", "retain_versions",
    "event_time", "watermark_delay", "watermark_interval", "late_records", "key",
})  # fmt: skip
"""The options that only the per-row operator has (state, replay, event time, keys)."""

DEFAULT_PROBE_KEYS: Final = 100
"""Keys the probe looks up one at a time (a columnar lookup: one chunk, at most
:data:`MAX_PROBE_CHUNK` keys), after as many to warm up."""
MAX_PROBE_CHUNK: Final = 5000
DEFAULT_BROADCAST_THRESHOLD: Final = 64 * 1024 * 1024
"""Bytes of the lookup side (estimated) up to which the join is broadcast."""
ANSWER_BYTES: Final = 200
"""Bytes of one answer row assumed when no probe measured them."""
TABLE_PROBE_MAX_ROWS: Final = 1_000_000
"""Table rows up to which the probe looks up the table's own keys (one part of them: the
server scans the table once) rather than a sample of the input's (a Spark job)."""
TABLE_PROBE_CHUNK: Final = 1000
"""Keys of a chunk the table's probe times (a columnar lookup): a smaller chunk than the
operator's, for a quicker probe; its rate is lower (a query's fixed cost weighs more),
which leans to the strategies that make fewer lookups."""
BULK_ROWS_PER_PART: Final = 50_000
"""Table rows per Spark task of a bulk read (at most four tasks per task slot)."""

# The cost model's Spark side, per task slot, from bench.lookup_join's runs on 2 busy
# cores (rounded): rows per second through the operator's Arrow pass (to Python and
# back), through a shuffle (an aggregation's or a sort-merge join's), probing a broadcast
# table; and the seconds a stage costs before its first row.
PASS_ROWS_PER_SECOND: Final = 1_000_000
SHUFFLE_ROWS_PER_SECOND: Final = 300_000
BROADCAST_ROWS_PER_SECOND: Final = 2_000_000
STAGE_SECONDS: Final = 0.3


@runtime_checkable
class _Joinable(Protocol):
    """What ``lookup_join`` asks of a lookup beyond an AsyncFunction (the connector base)."""

    def join_strategies(self) -> tuple[str, ...]: ...

    def request_fields(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class JoinEstimates:
    """What :func:`choose` weighs: the input's ``rows`` and ``distinct_keys`` (None: not
    estimated), the table's (``table``, ``table_rows``, ``table_bytes``: None without a
    bulk read), the lookups per second of the whole cluster (``rate``, from
    ``rate_source``), the cluster's task ``slots``, the bytes of one answer row, and the
    lookups the probe made (``probe_calls``); each ``*_source`` says where its figure
    came from, or why it was not estimated."""

    rows: int | None = None
    rows_source: str = "count"
    distinct_keys: int | None = None
    distinct_source: str = "approx_count_distinct"
    table: str | None = None
    table_rows: int | None = None
    table_bytes: int | None = None
    table_source: str | None = None
    rate: float | None = None
    rate_source: str = "not measured"
    slots: int = 1
    answer_bytes: float = ANSWER_BYTES
    probe_calls: int = 0


@dataclass(frozen=True)
class JoinChoice:
    """A strategy and why: ``given`` (by the caller) or chosen by :func:`choose` from
    ``estimates``, with each possible strategy's estimated ``seconds`` and ``calls``
    (lookups), and whether the lookup side is ``broadcast``."""

    strategy: str
    possible: tuple[str, ...]
    reason: str
    given: bool = False
    estimates: JoinEstimates | None = None
    seconds: Mapping[str, float] = field(default_factory=dict)
    calls: Mapping[str, int] = field(default_factory=dict)
    broadcast: bool = False

    def explain(self) -> str:
        """The choice, its reason and the estimates, as ``explain=True`` prints them."""
        how = "given" if self.given else "auto"
        lines = [f"lookup_join: strategy {self.strategy!r} ({how}): {self.reason}",
                 f"  possible          {', '.join(self.possible)}"]  # fmt: skip
        e = self.estimates
        if e is not None:
            if e.rows is not None:
                lines.append(f"  input rows        {e.rows:,} ({e.rows_source})")
            if e.distinct_keys is not None:
                lines.append(f"  distinct keys     ~{e.distinct_keys:,} ({e.distinct_source})")
            elif e.rows is not None:
                lines.append(f"  distinct keys     not estimated ({e.distinct_source})")
            if e.table is not None:
                lines.append(f"  table             {e.table}: ~{e.table_rows:,} rows, "
                             f"{_size(e.table_bytes or 0)} ({e.table_source})")  # fmt: skip
            if e.rate is not None:
                lines.append(f"  service rate      ~{e.rate:,.0f} lookups/s ({e.rate_source})")
        if self.seconds:
            unseen = e is not None and e.distinct_keys is None  # distinct's: a lower bound
            lines.append("  estimated seconds " + " | ".join(
                f"{s} {'>=' if unseen and s == 'distinct' else ''}{v:,.2f}"
                for s, v in self.seconds.items()))  # fmt: skip
        if self.calls:
            lines.append("  lookups           " + " | ".join(
                f"{s} {v:,}" for s, v in self.calls.items()))  # fmt: skip
            if "rows" in self.calls and self.strategy in self.calls:
                saved = self.calls["rows"] - self.calls[self.strategy]
                lines.append(f"  lookups saved     ~{max(saved, 0):,} of ~{self.calls['rows']:,}")
        if self.strategy != "rows":
            join = "broadcast" if self.broadcast else "Spark decides"
            lines.append(f"  join              {join}")
        return "\n".join(lines)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def choose(
    possible: Sequence[str], estimates: JoinEstimates, broadcast_threshold: int
) -> JoinChoice:
    """The cheapest of the ``possible`` strategies for ``estimates`` (the cost model).

    In seconds, with N input rows, D distinct keys, T table rows, r lookups per
    second (the cluster's), S task slots, and the Spark rates per slot of this
    module (:data:`PASS_ROWS_PER_SECOND`, :data:`SHUFFLE_ROWS_PER_SECOND`,
    :data:`BROADCAST_ROWS_PER_SECOND`, :data:`STAGE_SECONDS` a stage)::

        rows     = N/r + N/(pass*S)
        distinct = D/r + D/(pass*S) + N/(shuffle*S) + join(N, D) + 2 stages
        bulk     = T/r + T/(pass*S) + join(N, T) + 2 stages
        join(N, M) = N/(broadcast*S)          when M's answers fit broadcast_threshold
                     (N + M)/(shuffle*S)      otherwise

    The answers' bytes: D (or T) times the probe's bytes per answer for distinct, the
    table's bytes for bulk. A tie goes to the first of rows, distinct, bulk.
    """
    n, d, t = estimates.rows, estimates.distinct_keys, estimates.table_rows
    r, s = estimates.rate, max(1, estimates.slots)
    if n is None or r is None or r <= 0:
        raise ConfigurationError("choose() needs the input's rows and a positive rate")
    d = n if d is None else min(d, n)

    def join(m: float, fits: bool) -> float:
        if fits:
            return n / (BROADCAST_ROWS_PER_SECOND * s)
        return (n + m) / (SHUFFLE_ROWS_PER_SECOND * s)

    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    fits: dict[str, bool] = {}
    if "rows" in possible:
        seconds["rows"] = n / r + n / (PASS_ROWS_PER_SECOND * s)
        calls["rows"] = n
    if "distinct" in possible:
        fits["distinct"] = d * estimates.answer_bytes <= broadcast_threshold
        seconds["distinct"] = (d / r + d / (PASS_ROWS_PER_SECOND * s)
                               + n / (SHUFFLE_ROWS_PER_SECOND * s)
                               + join(d, fits["distinct"]) + 2 * STAGE_SECONDS)  # fmt: skip
        calls["distinct"] = d
    if "bulk" in possible and t is not None:
        fits["bulk"] = (estimates.table_bytes or 0) <= broadcast_threshold
        seconds["bulk"] = (t / r + t / (PASS_ROWS_PER_SECOND * s) + join(t, fits["bulk"])
                           + 2 * STAGE_SECONDS)  # fmt: skip
        calls["bulk"] = t
    best = min(seconds, key=lambda k: seconds[k])
    reason = f"the cheapest by the estimates (~{seconds[best]:,.2f} s)"
    return JoinChoice(best, tuple(possible), reason, estimates=estimates, seconds=seconds,
                      calls=calls, broadcast=fits.get(best, False))  # fmt: skip


def _strategies_of(function: Any) -> tuple[str, ...]:
    if not isinstance(function, _Joinable):
        return ("rows",)
    possible = tuple(function.join_strategies())
    return possible if "rows" in possible else ("rows", *possible)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _present(keys: Sequence[str]) -> Column:
    return reduce(lambda a, b: a & b, [F.col(_quoted(k)).isNotNull() for k in keys])


def _slots(df: DataFrame) -> int:
    spark = df.sparkSession
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect: no SparkContext
        return max(1, int(spark.conf.get("spark.default.parallelism", "2") or 2))


def lookup_join(
    df: DataFrame,
    lookup: Any,
    *,
    timeout: Any,
    output_schema: Any,
    strategy: str = "auto",
    how: str = "left",
    explain: bool = False,
    rate: float | None = None,
    probe_keys: int = DEFAULT_PROBE_KEYS,
    broadcast_threshold: int = DEFAULT_BROADCAST_THRESHOLD,
    **options: Any,
) -> DataFrame:
    """``df`` joined with what ``lookup`` answers for its rows, by the cheapest strategy.

    The rows equal ``ordered_wait``'s with the same options (``how="left"``: rows
    without an answer kept with NULLs; ``"inner"``: dropped), in no promised
    order; ``strategy`` is ``"auto"``, ``"rows"``, ``"distinct"`` or ``"bulk"``
    (see the module docstring and docs/lookup-join.md). ``explain=True`` prints
    the choice and its estimates; ``rate``: the lookups per second the service
    takes from the whole job (skips the probe); ``probe_keys``: the keys the
    probe looks up; ``broadcast_threshold``: the bytes of the lookup side up to
    which it is broadcast. Every other keyword is an ``ordered_wait`` option.

    Example::

        from asyncio_ops.connectors.http import HttpLookup
        from asyncio_ops.spark import lookup_join

        customers = HttpLookup("http://api:8080/customers/{customer_id}")
        enriched = lookup_join(orders, customers, timeout=10,
                               output_schema="name string, tier string", explain=True)
    """
    choice(strategy, "strategy", STRATEGIES)
    choice(how, "how", HOWS)
    for name, instead in (("on_empty", "how='left' or 'inner'"),
                          ("keep_input_columns", "a select() after the join")):  # fmt: skip
        if name in options:
            raise ConfigurationError(
                f"lookup_join() takes no {name} (given {name}={options[name]!r}): a join keeps "
                f"its input; use {instead}"
            )
    positive_int(probe_keys, "probe_keys")
    positive_int(broadcast_threshold, "broadcast_threshold")
    if rate is not None and (not isinstance(rate, int | float) or not rate > 0):
        raise ConfigurationError(f"rate must be lookups per second > 0 or None, got {rate!r}")
    on_empty = "keep" if how == "left" else "drop"
    # every option and the schemas checked, the preflight run once, by ordered_wait itself
    per_row = ordered_wait(df, lookup, timeout=timeout, output_schema=output_schema,
                           on_empty=on_empty, **options)  # fmt: skip
    wait_options = WaitOptions.of(timeout=timeout, on_empty=on_empty, **options)
    function = as_async_function(lookup)
    possible = _strategies_of(function)
    rows_only = sorted(k for k in options if k in ROWS_ONLY)
    if strategy == "rows":
        made = JoinChoice("rows", possible, "as given", given=True)
    elif strategy != "auto":
        _check_given(strategy, possible, df, rows_only, function)
        made = JoinChoice(strategy, possible, "as given", given=True)
    else:
        made = _auto(df, function, possible, rows_only, wait_options, rate, probe_keys,
                     broadcast_threshold)  # fmt: skip
    if made.strategy == "bulk" and made.estimates is None:
        made = _with_table(df, function, made, broadcast_threshold)
    log.info("%s", made.explain(), extra={"lookup_join": made})
    if explain:
        print(made.explain())
    if made.strategy == "rows":
        return per_row
    assert isinstance(function, _Joinable)
    keys = tuple(function.request_fields())

    # a bulk read looks up keys no row has: their failures must not fail the job, so it
    # keeps them as error rows, and the join fails on those an input row reaches
    deferred = made.strategy == "bulk" and wait_options.on_error == "fail"

    def wait(keys_df: DataFrame) -> DataFrame:
        inner = {**options, "on_empty": "drop", "preflight": False}
        if deferred:
            inner["on_error"] = "error_column"
        return ordered_wait(keys_df, lookup, timeout=timeout, output_schema=output_schema,
                            **inner)  # fmt: skip

    if made.strategy == "distinct":
        distinct = df.select(*[_quoted(k) for k in keys]).where(_present(keys)).distinct()
        if "num_partitions" not in options:  # lookups in every task slot, however few keys
            distinct = distinct.repartition(min(_slots(df), wait_options.max_parallelism))
        side = wait(distinct)
    else:
        side = wait(_table_keys(df, function, keys, made))
    if made.broadcast:
        side = F.broadcast(side)
    joined = df.join(side, on=list(keys), how=how)
    if deferred:
        error = F.col(ERROR_COLUMN)
        failed = F.raise_error(F.concat_ws(": ", error["exception"], error["message"]))
        joined = joined.where(F.when(error.isNotNull(), failed).isNull())
    return joined.select(*[_quoted(c) for c in per_row.columns])


def _check_given(
    strategy: str, possible: tuple[str, ...], df: DataFrame, rows_only: list[str], function: Any
) -> None:
    if strategy not in possible:
        raise ConfigurationError(
            f"strategy={strategy!r}: {type(function).__name__} can be joined by "
            f"{list(possible)} only (its join_strategies())"
        )
    if df.isStreaming:
        raise ConfigurationError(
            f"strategy={strategy!r} needs a batch DataFrame: on a stream use 'rows', or "
            "lookup_join inside foreachBatch (each micro-batch is a batch DataFrame)"
        )
    if rows_only:
        raise ConfigurationError(
            f"strategy={strategy!r} does not take {rows_only}: they are the per-row "
            "operator's (state, replay, event time, per-key order); use strategy='rows'"
        )


def _auto(
    df: DataFrame, function: Any, possible: tuple[str, ...], rows_only: list[str],
    options: WaitOptions, rate: float | None, probe_keys: int, broadcast_threshold: int,
) -> JoinChoice:  # fmt: skip
    """``strategy="auto"``: rows when nothing else may run, else :func:`choose` on the
    estimates made here, the cheap ones first (see the module docstring)."""
    if possible == ("rows",):
        return JoinChoice("rows", possible, f"{type(function).__name__} is joined per row only")
    if df.isStreaming:
        return JoinChoice("rows", possible, "a streaming DataFrame (distinct keys per "
                          "micro-batch: lookup_join inside foreachBatch)")  # fmt: skip
    if rows_only:
        return JoinChoice("rows", possible, f"{rows_only} are the per-row operator's options")
    keys = tuple(function.request_fields())
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise ConfigurationError(
            f"{type(function).__name__} looks rows up by {list(keys)}; the input has no "
            f"column(s) {missing} (columns: {df.columns})"
        )
    estimates = JoinEstimates(slots=_slots(df))
    if rate is not None:
        estimates = _replace(estimates, rate=float(rate), rate_source="given: rate=")
    if "bulk" in possible:
        planned = _planned_rows(df)
        estimates = _table_and_rate(df, keys, function, options, probe_keys, estimates,
                                    planned)  # fmt: skip
        if planned is not None and estimates.rate is not None:
            made = _bulk_unseen(possible, _replace(estimates, rows=planned[0],
                                rows_source=planned[1]), broadcast_threshold)  # fmt: skip
            if made is not None:
                return made
    key = F.struct(*[_quoted(k) for k in keys]) if len(keys) > 1 else F.col(_quoted(keys[0]))
    counting = df.select(
        F.count(F.lit(1)).alias("n"),
        F.approx_count_distinct(F.when(_present(keys), key)).alias("d"),
    )
    # the input counted by one Spark job while the service is probed (if it still must be)
    with ThreadPoolExecutor(1, thread_name_prefix="asyncio_ops-lookup-join") as pool:
        counted = pool.submit(counting.first)
        if estimates.rate is None:
            estimates = _probe(df, keys, function, options, probe_keys, estimates)
        row = counted.result()
    assert row is not None
    estimates = _replace(estimates, rows=int(row["n"]), distinct_keys=int(row["d"]))
    if estimates.rows == 0:
        return JoinChoice("rows", possible, "the input is empty", estimates=estimates)
    return choose(possible, estimates, broadcast_threshold)


def _bulk_unseen(
    possible: tuple[str, ...], estimates: JoinEstimates, broadcast_threshold: int
) -> JoinChoice | None:
    """``"bulk"`` without reading the input, when it costs less than ``"rows"`` and than
    ``"distinct"`` with no lookups (its cost grows with the distinct keys, which are
    not counted then); None when the choice depends on them."""
    assert estimates.rows is not None
    if not 0 < (estimates.table_rows or 0) < estimates.rows:
        return None
    bound = choose(possible, _replace(estimates, distinct_keys=0), broadcast_threshold)
    if bound.strategy != "bulk":
        return None
    why = (f"distinct costs at least {bound.seconds['distinct']:,.2f} s whatever its count "
           f"(its aggregation and join of ~{estimates.rows:,} rows), more than bulk"
           ) if "distinct" in bound.seconds else "distinct is not possible"  # fmt: skip
    calls = {k: v for k, v in bound.calls.items() if k != "distinct"}
    return JoinChoice(
        "bulk", possible,
        f"the cheapest by the estimates (~{bound.seconds['bulk']:,.2f} s), decided without "
        "reading the input",
        estimates=_replace(estimates, distinct_source=f"skipped: {why}"),
        seconds=bound.seconds, calls=calls, broadcast=bound.broadcast,
    )  # fmt: skip


_ROW_PRESERVING: Final = frozenset({
    "Project", "Repartition", "RepartitionByExpression", "Sort", "SubqueryAlias",
    "ResolvedHint", "Window",
})  # fmt: skip
"""Logical plan nodes whose rows are their child's (their row count is looked for below)."""


def _planned_rows(df: DataFrame) -> tuple[int, str] | None:
    """The input's rows as Spark's optimizer estimates them, without a job: the plan's
    ``rowCount`` (found under nodes that keep their child's rows), else its
    ``sizeInBytes`` over the bytes of a row (Spark's own: 8 + the columns' default
    sizes); None where the plan is out of reach (Spark Connect) or says nothing."""
    try:
        plan = df._jdf.queryExecution().optimizedPlan()
        row_bytes = 8 + int(df._jdf.schema().defaultSize())
        node = plan
        while True:
            stats = node.stats()
            count = stats.rowCount()
            if count.isDefined():
                where = f"Spark's plan statistics: rowCount of {node.nodeName()}"
                return int(str(count.get())), where
            if node.nodeName() not in _ROW_PRESERVING or node.children().size() != 1:
                break
            node = node.children().head()
        size = int(str(plan.stats().sizeInBytes()))
    except Exception:  # Spark Connect (no _jdf) or a plan without statistics
        return None
    if size <= 0 or size >= 2**62:  # Spark's "unknown" is Long.MaxValue
        return None
    return max(1, size // row_bytes), (f"Spark's plan statistics: sizeInBytes {_size(size)} "
                                       f"/ {row_bytes} B a row")  # fmt: skip


def _table_and_rate(
    df: DataFrame, keys: Sequence[str], function: Any, options: WaitOptions, probe_keys: int,
    estimates: JoinEstimates, planned: tuple[int, str] | None,
) -> JoinEstimates:  # fmt: skip
    """The table's statistics, and in the same driver session, when the rate is not given
    and the table has fewer rows than the input is planned to have (at most
    :data:`TABLE_PROBE_MAX_ROWS`), the rate from a probe of the table's own keys."""
    plan = _probe_plan(df, function, options, probe_keys)
    if plan.columnar and plan.chunk > TABLE_PROBE_CHUNK:
        plan = replace(plan, chunk=TABLE_PROBE_CHUNK, wanted=2 * TABLE_PROBE_CHUNK,
                       warm=TABLE_PROBE_CHUNK)  # fmt: skip
    schema = df.select(*[_quoted(k) for k in keys]).schema
    arrow = to_arrow_schema(schema, timezone=df.sparkSession.conf.get(
        "spark.sql.session.timeZone"))  # fmt: skip
    wanted = plan.wanted

    async def run(lookup: Any) -> tuple[Any, Any]:
        stats = await lookup.table_statistics()
        rows = stats.rows
        if (estimates.rate is not None or planned is None or not 0 < rows < planned[0]
                or rows > TABLE_PROBE_MAX_ROWS):  # fmt: skip
            return stats, None
        parts = max(1, rows // wanted)
        sample: pa.Table = await lookup.bulk_keys(0, parts, arrow)
        if sample.num_rows < 2:
            return stats, None
        sample = sample.slice(0, wanted)
        return stats, (sample.num_rows, await plan.measure(lookup, sample))

    stats, probed = _on_driver(function, run)
    estimates = _replace(estimates, table=stats.table, table_rows=stats.rows,
                         table_bytes=stats.bytes, table_source=stats.source)  # fmt: skip
    if probed is None:
        return estimates
    keys_probed, (timed, seconds, answer_bytes) = probed
    return plan.rated(estimates, timed, keys_probed - timed, seconds, answer_bytes,
                      "of the table's keys")  # fmt: skip


def _replace(estimates: JoinEstimates, **changes: Any) -> JoinEstimates:
    return replace(estimates, **changes)


def _on_driver(function: Any, call: Callable[[Any], Any]) -> Any:
    """``await call(copy)`` on a copy of ``function`` (as a worker receives it), opened on a
    loop and thread of their own, then closed: the caller's copy keeps its counters."""
    copy = deepcopy(function)  # the configuration only, as pickling to a worker gives

    async def run() -> Any:
        await maybe_await(copy.open(RuntimeContext()))
        try:
            return await call(copy)
        finally:
            await maybe_await(copy.close())

    return _run_alone(run)


def _with_table(
    df: DataFrame, function: Any, made: JoinChoice, broadcast_threshold: int
) -> JoinChoice:
    """A given ``"bulk"``: the table's statistics, for its parts and the broadcast."""
    stats = _on_driver(function, lambda lookup: lookup.table_statistics())
    estimates = JoinEstimates(table=stats.table, table_rows=stats.rows, table_bytes=stats.bytes,
                              table_source=stats.source, slots=_slots(df))  # fmt: skip
    return JoinChoice(made.strategy, made.possible, made.reason, given=True, estimates=estimates,
                      broadcast=stats.bytes <= broadcast_threshold)  # fmt: skip


def _table_keys(df: DataFrame, function: Any, keys: Sequence[str], made: JoinChoice) -> DataFrame:
    """The lookup's keys (``bulk_keys``), one Spark task per part, typed as ``df``'s keys."""
    e = made.estimates
    assert e is not None and e.table_rows is not None
    parts = max(1, min(math.ceil(e.table_rows / BULK_ROWS_PER_PART), 4 * e.slots))
    schema = df.select(*[_quoted(k) for k in keys]).schema
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    arrow = to_arrow_schema(schema, timezone=timezone)

    async def read(part: int) -> pa.Table:
        await maybe_await(function.open(RuntimeContext()))
        try:
            table: pa.Table = await function.bulk_keys(part, parts, arrow)
            return table
        finally:
            await maybe_await(function.close())

    def parts_of(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for part in batch.column(0).to_pylist():
                yield from asyncio.run(read(part)).to_batches()

    spark = df.sparkSession
    return spark.range(parts, numPartitions=parts).mapInArrow(parts_of, schema)


@dataclass(frozen=True)
class _ProbePlan:
    """How the probe looks keys up: as the operator would (per row with ``capacity`` in
    flight, or in chunks of ``chunk`` rows), ``wanted`` keys, the first ``warm`` of them
    (half) to warm up: connections, prepared queries, the server's plans and caches."""

    columnar: bool
    chunk: int
    capacity: int
    wanted: int
    warm: int
    timeout: float

    async def measure(self, lookup: Any, keys: pa.Table) -> tuple[int, float, float]:
        """The keys timed, their seconds, and the bytes of one answer: the first ``warm``
        of ``keys`` (at most half) warm up (connections, prepared queries), the rest is
        timed."""
        half = min(self.warm, keys.num_rows // 2)
        warm, timed = keys.slice(0, half), keys.slice(half)
        await _look_up(lookup, warm, self.columnar, self.chunk, self.capacity, self.timeout)
        start = time.perf_counter()
        answers = await _look_up(lookup, timed, self.columnar, self.chunk, self.capacity,
                                 self.timeout)  # fmt: skip
        seconds = time.perf_counter() - start
        return timed.num_rows, seconds, _answer_bytes(answers, self.columnar)

    def rated(
        self, estimates: JoinEstimates, timed: int, warm: int, seconds: float,
        answer_bytes: float, what: str,
    ) -> JoinEstimates:  # fmt: skip
        per_task = timed / max(seconds, 1e-6)
        how = (f"a probe {what}: {timed} on the driver after {warm}, "
               f"{'in chunks' if self.columnar else 'per row'} with capacity {self.capacity}: "
               f"{per_task:,.0f}/s, times {estimates.slots} task slots")  # fmt: skip
        return _replace(estimates, rate=per_task * estimates.slots, rate_source=how,
                        answer_bytes=answer_bytes or ANSWER_BYTES,
                        probe_calls=timed + warm)  # fmt: skip


def _probe_plan(df: DataFrame, function: Any, options: WaitOptions, probe_keys: int) -> _ProbePlan:
    batch_size = batch_size_of(df, options.batch_size)
    chunk_rows = chunk_rows_of(options.chunk_size, function, options.rows_as, options.retry,
                               batch_size)  # fmt: skip
    capacity = options.capacity  # "auto": the default's, where the adaptive limit starts
    if not isinstance(capacity, int):
        capacity = default_capacity(function, options.chunk_size, chunk_rows)
    columnar = chunk_rows is not None and isinstance(function, SupportsInvokeArrow)
    chunk = min(chunk_rows or 1, MAX_PROBE_CHUNK)
    wanted = 2 * chunk if columnar else probe_keys
    warm = wanted // 2
    return _ProbePlan(columnar, chunk, capacity, wanted, warm, options.timeout)


def _probe(
    df: DataFrame, keys: Sequence[str], function: Any, options: WaitOptions, probe_keys: int,
    estimates: JoinEstimates,
) -> JoinEstimates:  # fmt: skip
    """The service's rate: ``probe_keys`` distinct keys of ``df`` (a columnar lookup: two
    chunks of at most :data:`MAX_PROBE_CHUNK`) looked up on the driver as the operator
    would (:class:`_ProbePlan`); the cluster's rate is that times its task slots."""
    plan = _probe_plan(df, function, options, probe_keys)
    wanted = plan.wanted
    sample = df.select(*[_quoted(k) for k in keys]).where(_present(keys)).limit(4 * wanted)
    table = sample.toArrow()
    rows = list({tuple(r.values()): r for r in table.to_pylist()}.values())[:wanted]
    if len(rows) < 2:
        return _replace(estimates, rate=float(DEFAULT_CAPACITY) / options.timeout,
                        rate_source="too few keys to probe: capacity / timeout")  # fmt: skip
    distinct = pa.Table.from_pylist(rows, schema=table.schema)
    timed, seconds, answer_bytes = _on_driver(function, partial(plan.measure, keys=distinct))
    return plan.rated(estimates, timed, len(rows) - timed, seconds, answer_bytes,
                      "of the input's keys")  # fmt: skip


async def _look_up(
    lookup: Any, keys: pa.Table, columnar: bool, chunk: int, capacity: int, limit: float
) -> list[Any]:
    """The answers to ``keys`` (an error or a timeout: None), per row or in chunks of
    ``chunk`` rows, ``capacity`` at a time, each within ``limit`` seconds."""
    gate = asyncio.Semaphore(capacity)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            try:
                return await asyncio.wait_for(call(), limit)
            except Exception:  # an error answer or a timeout took its time: it counts
                return None

    if columnar:
        calls = [partial(lookup.async_invoke_arrow, b) for b in keys.to_batches(chunk)]
    else:
        calls = [partial(lookup.async_invoke, row) for row in keys.to_pylist()]
    return list(await asyncio.gather(*(one(call) for call in calls)))


def _answer_bytes(answers: list[Any], columnar: bool) -> float:
    """Bytes of one answer row, roughly: Arrow's for columns, a row's repr otherwise."""
    count, size = 0, 0
    for answer in answers:
        if answer is None:
            continue
        if columnar:
            columns = answer[1]
            for values in columns.values():
                array = values if isinstance(values, pa.Array) else pa.array(values)
                size += array.nbytes
            index = answer[0]
            count += len(index) if index is not None else len(next(iter(columns.values()), []))
        else:
            for row in answer:
                size += len(repr(row))
                count += 1
    return size / count if count else 0.0


def _signature() -> inspect.Signature:
    """``(df, lookup, *, timeout, output_schema, <its own keywords>, <ordered_wait's
    options but on_empty and keep_input_columns>)``."""
    own = inspect.signature(lookup_join).parameters
    wait = list(WAIT_SIGNATURE.parameters.values())
    mine = [own[n] for n in ("strategy", "how", "explain", "rate", "probe_keys",
                             "broadcast_threshold")]  # fmt: skip
    rest = [p for p in wait[4:] if p.name not in ("on_empty", "keep_input_columns")]
    return WAIT_SIGNATURE.replace(parameters=[own["df"], own["lookup"], *wait[2:4], *mine, *rest])


# what help() and inspect show; a keyword neither has is refused with a hint (on_empty and
# keep_input_columns pass, for lookup_join's own message)
lookup_join.__signature__ = _signature()  # type: ignore[attr-defined]
lookup_join = known_keywords(forwards_to=ordered_wait)(lookup_join)
