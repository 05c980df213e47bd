"""Model lookups on the standalone cluster (run by spark-submit from test_llm_quota.py).

    llm_job.py share BASE REDIS NAME LABEL ROWS RATE BURST BARRIER OUT
    llm_job.py cache BASE REDIS NAME ROWS MARKERS OUT

``share``: label ROWS reviews with ``ChatLookup(model=LABEL)`` through a
``RateLimit`` of RATE requests per second (BURST at once) shared through Redis
under NAME; before the action the driver writes ``BARRIER/LABEL`` and waits for
the other job's file, so the two jobs ask at the same time. ``cache``: label
ROWS reviews through a ``LookupCache`` shared through Redis under NAME, one row
at a time; the first attempt of the task that answers the 10th row SIGKILLs
its executor's JVM right after that answer (the first time only, a marker
file in MARKERS), so the task runs again elsewhere; then a second action over
the same rows. OUT receives the rows and the server's request counts after
each action (``GET /stats``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

from asyncio_ops.connectors import LookupCache, RateLimit, Row
from asyncio_ops.connectors.openai import ChatLookup

from asyncio_ops.spark import session, unordered_wait

KILL_AFTER = 10


def _served(base: str) -> int:
    with urllib.request.urlopen(f"{base}/stats", timeout=30) as r:
        return int(json.load(r)["requests"])


def _first_time(markers: str, name: str) -> bool:
    try:
        fd = os.open(os.path.join(markers, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


class ChatOrDie(ChatLookup):
    """A ChatLookup whose 10th answer in a process kills the executor once."""

    def __init__(self, *args: Any, markers: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.markers = markers
        self.answered = 0

    async def lookup(self, value: Mapping[str, Any]) -> list[Row]:
        rows = await super().lookup(value)  # answered, and in the shared cache
        self.answered += 1
        if self.answered == KILL_AFTER and _first_time(self.markers, "kill"):
            _kill_executor()
        return rows


def _kill_executor() -> None:
    """SIGKILL the executor JVM this Python worker belongs to (its daemon's parent)."""
    daemon = os.getppid()
    with open(f"/proc/{daemon}/stat") as f:
        executor_jvm = int(f.read().rsplit(")", 1)[1].split()[1])
    os.kill(executor_jvm, signal.SIGKILL)
    os._exit(1)  # never reached in practice: the JVM's death ends this worker


def share(base: str, redis: str, name: str, label: str, rows: int, rate: float, burst: int,
          barrier: str, out: str) -> None:  # fmt: skip
    spark = session(app_name=f"asyncio_ops-llm-share-{label}")
    limit = RateLimit(requests_per_second=rate, burst=burst, shared=redis, name=name)
    chat = ChatLookup(base, label, prompt="Review {id}: {text}", max_tokens=8, rate_limit=limit)
    df = spark.createDataFrame([(i, "good value" if i % 2 else "broken") for i in range(rows)],
                               "id long, text string").repartition(2)  # fmt: skip
    labelled = unordered_wait(df, chat, timeout=300, capacity=32, output_schema="answer string")
    spark.range(2, numPartitions=2).count()  # the executor is up before the barrier
    open(os.path.join(barrier, label), "w").close()
    deadline = time.monotonic() + 240
    while len(os.listdir(barrier)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    got = [r.asDict() for r in labelled.collect()]
    with open(out, "w") as f:
        json.dump({"rows": got}, f)
    spark.stop()


def cache(base: str, redis: str, name: str, rows: int, markers: str, out: str) -> None:
    spark = session(app_name="asyncio_ops-llm-cache")
    texts = [(i, f"review {i} good" if i % 3 else f"review {i} dull") for i in range(rows)]
    df = spark.createDataFrame(texts, "id long, text string").repartition(2)

    def lookup(**extra: Any) -> ChatLookup:
        shared = LookupCache(ttl=3600, shared=redis, name=name)
        if extra:
            return ChatOrDie(base, "local", prompt="{text}", cache=shared, **extra)
        return ChatLookup(base, "local", prompt="{text}", cache=shared)

    first = unordered_wait(df, lookup(markers=markers), timeout=120, capacity=1,
                           output_schema="answer string").collect()  # fmt: skip
    after_first = _served(base)
    second = unordered_wait(df, lookup(), timeout=120, output_schema="answer string").collect()
    after_second = _served(base)
    with open(out, "w") as f:
        json.dump({"first": [r.asDict() for r in first], "second": [r.asDict() for r in second],
                   "after_first": after_first, "after_second": after_second,
                   "killed": os.path.exists(os.path.join(markers, "kill"))}, f)  # fmt: skip
    spark.stop()


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "share":
        base, redis, name, label, rows, rate, burst, barrier, out = args
        share(base, redis, name, label, int(rows), float(rate), int(burst), barrier, out)
    else:
        base, redis, name, rows, markers, out = args
        cache(base, redis, name, int(rows), markers, out)


if __name__ == "__main__":
    main()
