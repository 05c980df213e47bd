"""A SparkSession that works out of the box for asyncio_ops."""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession

from . import _job_errors

# every core, and up to 4 attempts per task, as a cluster gives (spark.task.maxFailures):
# plain local[*] tries a task once, so one killed Python worker would fail the job
DEFAULT_MASTER = "local[*, 4]"


def resolve_master(
    master: str | None,
    conf: dict[str, Any] | None,
    environ: dict[str, str] | os._Environ[str],
    active: bool,
) -> str | None:
    """The master ``session()`` sets, or None to leave it to Spark.

    A master chosen elsewhere wins; ``session()`` only fills in what is missing:

    1. ``master=`` given to ``session()``, or ``spark.master`` in its ``conf``;
    2. a session already active in this process (``getOrCreate`` returns it);
    3. ``spark-submit --master`` (the driver was launched by spark-submit: the
       JVM it connects to, ``PYSPARK_GATEWAY_PORT``, holds the master);
    4. ``SPARK_MASTER`` or ``MASTER`` in the environment;
    5. otherwise ``local[*, 4]``: every core, and a failed task tried up to 4 times,
       as on a cluster (``local[*]`` would try it once).
    """
    if master is not None:
        return master
    if (conf and "spark.master" in conf) or active or environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    return environ.get("SPARK_MASTER") or environ.get("MASTER") or DEFAULT_MASTER


def session(
    master: str | None = None,
    app_name: str = "asyncio_ops",
    conf: dict[str, Any] | None = None,
) -> SparkSession:
    """Get or create a SparkSession whose Python workers run this interpreter.

    Workers must import asyncio_ops and the user's function: they run
    ``sys.executable`` (``PYSPARK_PYTHON`` and ``spark.pyspark.python``) unless
    the caller's ``conf`` says otherwise. The master is the one given, else the
    one spark-submit, an active session or the environment chose, else
    ``local[*, 4]``, whose tasks are retried as a cluster's are
    (:func:`resolve_master`). Shuffle partitions are few on a
    local master, as suits a laptop; everything else is Spark's default, the
    UI included (progress, stages and task times at port 4040 and on). A job
    failed by an asyncio_ops exception raises that exception, Spark's as its
    cause (docs/spark.md, "When a job fails").

    Example::

        from asyncio_ops.spark import session

        spark = session()  # local[*, 4] unless spark-submit or the environment says
        cluster = session("spark://master:7077", app_name="enrich",
                          conf={"spark.executor.memory": "4g"})
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    chosen = resolve_master(master, conf, os.environ, SparkSession.getActiveSession() is not None)
    builder = SparkSession.builder.appName(app_name)
    if chosen is not None:
        builder = builder.master(chosen)
    builder = builder.config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
    builder = builder.config("spark.pyspark.driver.python", sys.executable)
    effective = chosen or str((conf or {}).get("spark.master", ""))
    if effective.startswith("local"):
        builder = builder.config("spark.sql.shuffle.partitions", "4")
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    _job_errors.install()  # after the session's own converter (its __init__ installs one)
    return spark
