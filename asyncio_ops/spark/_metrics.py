"""``AsyncMetrics``: the async operator's metrics summed over the tasks of a job.

The workers' figures (``asyncio_ops._runtime.RunMetrics``, one per partition)
travel back in a Spark accumulator; the driver reads the sum after an action.
"""

from __future__ import annotations

from typing import Any

from pyspark import AccumulatorParam

from .._exceptions import ConfigurationError
from .._runtime import RunMetrics

__all__ = ["AsyncMetrics"]


class _MetricsParam(AccumulatorParam[RunMetrics]):
    def zero(self, value: RunMetrics) -> RunMetrics:
        return RunMetrics()

    def addInPlace(self, value1: RunMetrics, value2: RunMetrics) -> RunMetrics:
        return value1.merge(value2)


class AsyncMetrics:
    """Operator metrics of one ``ordered_wait``/``unordered_wait``, summed over tasks.

    Read :attr:`value` (or :meth:`summary`) after an action has run. Backed by
    a Spark accumulator, so a task that Spark re-runs counts twice: these are
    monitoring figures, not results.

    Example::

        from asyncio_ops.spark import AsyncMetrics, ordered_wait, session

        async def lookup(row):
            return [{"name": f"customer-{row['id']}"}]

        spark = session()
        metrics = AsyncMetrics(spark)
        ordered_wait(spark.range(1000), lookup, timeout=5.0, output_schema="name string",
                     metrics=metrics).count()
        print(metrics.summary())  # after the action: its tasks' figures, summed
    """

    def __init__(self, spark: Any) -> None:
        try:
            context = spark.sparkContext
        except Exception as exc:  # Spark Connect has no SparkContext, hence no accumulators
            raise ConfigurationError(
                "AsyncMetrics needs a classic SparkSession (Spark Connect has no "
                "accumulators); read the per-partition summaries the workers log instead"
            ) from exc
        self._acc = context.accumulator(RunMetrics(), _MetricsParam())

    @property
    def value(self) -> RunMetrics:
        return self._acc.value  # type: ignore[no-any-return]

    def summary(self) -> dict[str, Any]:
        return self.value.summary()

    def _add(self, metrics: RunMetrics) -> None:
        self._acc.add(metrics)
