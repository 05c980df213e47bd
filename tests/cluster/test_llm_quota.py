"""Model lookups on the real two-worker standalone cluster (tests/cluster/conftest.py),
against the example OpenAI-compatible server in this process and the real Redis on
127.0.0.1:6379: two concurrent jobs naming one shared RateLimit split it and together
keep to it; a LookupCache shared through Redis pays for each answer once, across a
killed executor's retry and a second job over the same rows."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from asyncio_ops.services.models import OpenAIServiceThread, sentiment

from tests.cluster.conftest import ROOT, SPARK_HOME, _env
from tests.connectors.conftest import REDIS_URL
from tests.helpers import unavailable

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = str(ROOT / "tests" / "cluster" / "llm_job.py")
RATE, BURST, ROWS = 10, 2, 60  # requests per second, at once, rows per job


@pytest.fixture
def redis_name() -> Iterator[str]:
    """Reachable Redis (skipped without, failed under CI=true); a name of this test's own
    whose keys are deleted after."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
    try:
        client.ping()
    except Exception as exc:
        unavailable(f"Redis not reachable at {REDIS_URL} ({type(exc).__name__})")
    name = f"test-cluster-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        for pattern in (f"asyncio_ops:rate:{name}:*", f"asyncio_ops:cache:{name}:*"):
            keys = list(client.scan_iter(pattern))
            if keys:
                client.delete(*keys)
        client.close()


def _submit(url: str, zip_: Path, cwd: Path, *args: str, cores: int | None = None
            ) -> subprocess.Popen[str]:  # fmt: skip
    confs = ["--conf", "spark.ui.enabled=false"]
    if cores is not None:  # share the cluster: one executor of one core each
        confs += ["--conf", f"spark.cores.max={cores}"]
    return subprocess.Popen(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", url, "--py-files", str(zip_),
         *confs, JOB, *args],
        cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait(proc: subprocess.Popen[str], timeout: float) -> None:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == 0, err[-4000:]


@pytest.mark.timeout(420)
def test_two_jobs_naming_one_shared_limit_split_it(
    cluster: tuple[str, Path], shipped_zip: Path, redis_name: str, tmp_path: Path
) -> None:
    """Two applications at once (one executor each), each labelling ROWS rows through a
    RateLimit of RATE/s (BURST at once) shared under one name. The server's quota is
    that rate with BURST + 1 requests of bucket: every 1-second window holds at most
    RATE + BURST requests, none is refused, the pair keeps 0.9 RATE or more from the
    first request to the last, and while both run each gets 30-70 % of it."""
    url, _ = cluster
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    with OpenAIServiceThread(requests_per_minute=RATE * 60,
                             burst_seconds=(BURST + 1) / RATE) as service:  # fmt: skip
        jobs = [
            _submit(
                url,
                shipped_zip,
                tmp_path,
                "share",
                service.url,
                REDIS_URL,
                redis_name,
                label,
                str(ROWS),
                str(RATE),
                str(BURST),
                str(barrier),
                str(tmp_path / f"{label}.json"),
                cores=1,
            )
            for label in ("job-a", "job-b")
        ]
        for job in jobs:
            _wait(job, 360)
        log = list(service.stats["log"])
    for label in ("job-a", "job-b"):
        rows = json.loads((tmp_path / f"{label}.json").read_text())["rows"]
        assert sorted(r["id"] for r in rows) == list(range(ROWS))
        assert all(r["answer"] == ("positive" if r["id"] % 2 else "negative") for r in rows)
    assert [s for _, _, s in log].count(429) == 0, log  # no request refused
    times = sorted(t for t, _, s in log if s == 200)
    assert len(times) == 2 * ROWS
    busiest = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    assert busiest <= RATE + BURST, busiest
    achieved = (len(times) - 1) / (times[-1] - times[0])
    assert achieved >= 0.9 * RATE, achieved
    by_job = {label: [t for t, m, _ in log if m == label] for label in ("job-a", "job-b")}
    start = max(ts[0] for ts in by_job.values())
    end = min(ts[-1] for ts in by_job.values())
    assert end - start >= 3.0, (start, end)  # the barrier made them overlap
    both = {label: sum(1 for t in ts if start <= t <= end) for label, ts in by_job.items()}
    share = both["job-a"] / (both["job-a"] + both["job-b"])
    assert 0.3 <= share <= 0.7, both
    print(
        f"\nshared limit {RATE}/s burst {BURST}: {achieved:.2f} requests/s over "
        f"{times[-1] - times[0]:.1f} s, busiest second {busiest}, overlap {end - start:.1f} s "
        f"split {both}"
    )


@pytest.mark.timeout(420)
def test_a_shared_cache_pays_once_across_a_killed_executor_and_a_second_job(
    cluster: tuple[str, Path], shipped_zip: Path, redis_name: str, tmp_path: Path
) -> None:
    """40 rows, one at a time per task, through a LookupCache shared through Redis: the
    task answering its 10th row kills its executor; its retry asks only for the rows
    not yet answered, and a second job over the same rows asks for none."""
    url, _ = cluster
    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "cache.json"
    with OpenAIServiceThread() as service:
        job = _submit(url, shipped_zip, tmp_path, "cache", service.url, REDIS_URL, redis_name,
                      "40", str(markers), str(out))  # fmt: skip
        _wait(job, 360)
    result = json.loads(out.read_text())
    assert result["killed"]
    expected = sorted((i, sentiment(f"review {i} good" if i % 3 else f"review {i} dull"))
                      for i in range(40))  # fmt: skip
    for action in ("first", "second"):
        assert sorted((r["id"], r["answer"]) for r in result[action]) == expected
    assert result["after_first"] == 40  # each row paid once, the killed attempt's included
    assert result["after_second"] == 40  # the second job asked for nothing
