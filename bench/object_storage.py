"""Benchmark: what a small streaming micro-batch costs on object storage and on local disk.

Run: ``python -m bench.object_storage`` (``--keys 10000 100000 --touch 100
--batches 4 --partitions 2``, ``--show-requests`` to print the last
micro-batch's requests, ``--latency-ms 30`` to put the S3 server a round
trip of 30 ms away, ``--retain-versions 10`` and ``--full-snapshot-interval
50``, ``keyed_process``'s options: past ``retain_versions`` versions partition
0 lists the oldest retained one, and deletes a version in most micro-batches
once chains restart within the run; needs the dev extra, which brings moto's
S3 server; ``--operator unordered_wait`` runs the async operator instead: a
lookup that answers at once and checkpoints a cache of its answers, keyed, its
carry-over checkpointed under the same location, so a small micro-batch is
its restore (the caches every partition wrote among it), its writes and
partition 0's retention).

The job: ``keyed_process`` keeping a running count per key (a ValueState), one
output row per event, into Spark's ``noop`` sink. A first micro-batch creates
``--keys`` keys; then ``--batches`` small micro-batches each touch ``--touch``
random keys (one Parquet file and one ``availableNow`` run per micro-batch, so
that each count holds exactly one micro-batch). The state lives under
``checkpoint_location``, once on local disk and twice on an S3-compatible
server started here on 127.0.0.1 (moto's ThreadedMotoServer), at
``--partitions`` partitions: ``s3``, with the local copies of the key-group
files a worker writes (the default: a partition restored on the machine that
wrote its versions reads its chains from them), and ``s3 elsewhere``, with
local copies off (``ASYNCIO_OPS_LOCAL_COPIES=0``: every partition as if on
another machine). Every micro-batch is a new query, so each partition starts
cold (not kept warm by its Python worker). Printed per small
micro-batch (median over the small batches): S3 requests, counted from the
server's own log (all partitions together, per partition, and the most per
partition of any small micro-batch), bytes written to
the version the micro-batch wrote, and Spark's ``durationMs.triggerExecution``.

A local S3 emulator answers in well under a millisecond; a real store takes
20-50 ms per request, so the request count is the figure that carries over,
and with ``--latency-ms`` a TCP proxy in front of the server holds each
request that long before passing it on (the first bytes a client sends after
an answer), which the seconds then include.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import re
import socket
import statistics
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from asyncio_ops import AsyncFunction
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops._storage._local_copies import LOCAL_COPIES_ENV
from asyncio_ops.spark import keyed_process, session, unordered_wait
from asyncio_ops.state import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    ValueStateDescriptor,
)


class CachedLookup(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Answers at once and checkpoints a cache of its answers (the last 1,000 keys), as
    the connectors' lookups with a cache do: each partition writes its table with every
    version, and each restores every partition's."""

    def __init__(self) -> None:
        self.cache: dict[int, int] = {}

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        n = self.cache.setdefault(row["key"], row["key"] * 2)
        return [{"n": n}]

    def snapshot_function_state(self) -> pa.Table | None:
        keys = list(self.cache)[-1000:]
        return pa.table({"key": keys, "n": [self.cache[k] for k in keys]}) if keys else None

    def initialize_function_state(self, tables: Sequence[pa.Table]) -> None:
        for table in tables:
            keys, ns = table.column("key").to_pylist(), table.column("n").to_pylist()
            self.cache.update(zip(keys, ns, strict=True))


class Count(KeyedProcessFunction[int, dict[str, Any], dict[str, Any]]):
    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor[int]("count"))

    def process_element(
        self, value: dict[str, Any], ctx: KeyedProcessContext, out: Collector[dict[str, Any]]
    ) -> None:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        out.collect({"key": value["key"], "n": n})


class _Requests(logging.Handler):
    """Counts the S3 server's requests from its log (one line per request)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage())
        if line.count('"') >= 2:
            self.lines.append(line.split('"')[1])


class _Latency:
    """A TCP proxy on 127.0.0.1 in front of ``port`` that holds each request ``seconds``:
    the first chunk a client sends after the server last answered it waits, then passes
    on. Runs its own event loop on a daemon thread."""

    def __init__(self, port: int, seconds: float) -> None:
        self.target, self.seconds = port, seconds
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.port = 0

        async def serve() -> None:
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            async with server:
                await server.serve_forever()

        threading.Thread(target=self.loop.run_until_complete, args=(serve(),),
                         daemon=True).start()  # fmt: skip
        if not ready.wait(30):
            raise RuntimeError("the latency proxy did not start")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        answered = [True]  # a new connection's first bytes are a request

        async def requests() -> None:
            while data := await reader.read(1 << 16):
                if answered[0]:
                    answered[0] = False
                    await asyncio.sleep(self.seconds)
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def answers() -> None:
            while data := await up_reader.read(1 << 16):
                answered[0] = True
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(requests(), answers())
        except (ConnectionError, OSError):
            writer.close()
            up_writer.close()


def _s3(requests: _Requests, latency: float = 0.0) -> tuple[Any, str]:
    from moto.server import ThreadedMotoServer

    log = logging.getLogger("werkzeug")
    log.addHandler(requests)
    log.setLevel(logging.INFO)
    log.propagate = False
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    if latency > 0:
        port = _Latency(port, latency).port
    options = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    fs, _ = pafs.FileSystem.from_uri(
        f"s3://bench:bench@aops-bench/x?{options}&allow_bucket_creation=true"
    )
    fs.create_dir("aops-bench")
    return server, f"s3://bench:bench@aops-bench/{{path}}?{options}"


def _inputs(keys: int, touch: int, batches: int) -> list[pa.Table]:
    """Micro-batch inputs: every key once, then ``batches`` tables of ``touch`` keys."""
    rng = random.Random(7)
    first = pa.table({"key": pa.array(range(keys), pa.int64())})
    return [first] + [
        pa.table({"key": pa.array([rng.randrange(keys) for _ in range(touch)], pa.int64())})
        for _ in range(batches)
    ]


def _run(
    spark: SparkSession, inputs: list[pa.Table], location: str, work: Path, partitions: int,
    requests: _Requests, show: bool = False, local_copies: bool = True, retain: int = 10,
    interval: int = 50, operator: str = "keyed_process",
) -> list[tuple[int, int, float]]:  # fmt: skip
    """(S3 requests, bytes written, seconds) of each small micro-batch.

    One file is added and one ``availableNow`` run made per micro-batch, so that
    each count holds exactly that micro-batch's requests (the driver's checks when
    the DataFrame is built are left out: they are paid per query start).
    """
    source = work / "in"
    source.mkdir(parents=True)
    storage = CheckpointStorage(location, "counts")
    seen: list[tuple[int, int, float]] = []
    # the workers' environment (Spark starts workers for it apart from the others)
    spark.sparkContext.environment[LOCAL_COPIES_ENV] = (
        os.environ.get(LOCAL_COPIES_ENV, "") if local_copies else "0"
    )
    for batch, table in enumerate(inputs):
        pq.write_table(table, source / f"{batch:04d}.parquet")
        stream = spark.readStream.schema("key long").parquet(str(source))
        if operator == "unordered_wait":
            out = unordered_wait(
                stream, CachedLookup(), timeout=30, output_schema="n long", key="key", uid="counts",
                checkpoint_location=location, retain_versions=retain,
            )  # fmt: skip
        else:
            out = keyed_process(
                stream, Count(), key="key", output_schema="key long, n long", uid="counts",
                checkpoint_location=location, num_partitions=partitions, retain_versions=retain,
                full_snapshot_interval=interval,
            )  # fmt: skip
        requests.lines.clear()
        query = (
            out.writeStream.format("noop").option("checkpointLocation", str(work / "spark"))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(600)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        (progress,) = [p for p in query.recentProgress if p["numInputRows"]]
        assert progress["batchId"] == batch, progress["batchId"]
        made = list(requests.lines)  # before this bench's own listing below
        size = sum(
            info.size or 0
            for info in storage.fs.get_file_info(
                pafs.FileSelector(storage.version_dir(batch), allow_not_found=True)
            )
        )
        seen.append((len(made), size, progress["durationMs"]["triggerExecution"]))
        if show and batch == len(inputs) - 1 and made:
            print(f"requests of micro-batch {batch}:")
            for line in made:
                print(f"    {line}")
    return seen[1:]  # the small micro-batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--touch", type=int, default=100)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument(
        "--show-requests", action="store_true",
        help="print the S3 requests of the last micro-batch (method and path)",
    )  # fmt: skip
    parser.add_argument(
        "--latency-ms", type=float, default=0.0,
        help="hold each S3 request this long (a store a round trip away)",
    )  # fmt: skip
    parser.add_argument(
        "--retain-versions", type=int, default=10,
        help="keyed_process's retain_versions (retention runs past that many versions)",
    )  # fmt: skip
    parser.add_argument(
        "--full-snapshot-interval", type=int, default=50,
        help="keyed_process's full_snapshot_interval",
    )  # fmt: skip
    parser.add_argument(
        "--operator", choices=["keyed_process", "unordered_wait"], default="keyed_process",
    )  # fmt: skip
    args = parser.parse_args()
    spark = session(master="local[2]", app_name="bench-object-storage")
    spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    requests = _Requests()
    server, s3_template = _s3(requests, args.latency_ms / 1000)
    print(
        f"{args.operator}, {args.partitions} partitions, small micro-batches of "
        f"{args.touch} touched keys; median of {args.batches}; S3 {args.latency_ms:g} ms away"
    )
    print(f"{'keys':>9} {'storage':>12} {'requests':>9} {'per part.':>9} {'max/part.':>9} "
          f"{'bytes':>11} {'seconds':>8}")  # fmt: skip
    try:
        for keys in args.keys:
            inputs = _inputs(keys, args.touch, args.batches)
            with tempfile.TemporaryDirectory() as tmp:
                for name, location in (
                    ("local", str(Path(tmp) / "state")),
                    ("s3", s3_template.format(path=f"k{keys}")),
                    ("s3 elsewhere", s3_template.format(path=f"k{keys}-elsewhere")),
                ):
                    small = _run(spark, inputs, location, Path(tmp) / name.replace(" ", "-"),
                                 args.partitions, requests, args.show_requests,
                                 local_copies=name != "s3 elsewhere",
                                 retain=args.retain_versions,
                                 interval=args.full_snapshot_interval,
                                 operator=args.operator)  # fmt: skip
                    remote = name.startswith("s3")
                    reqs = statistics.median(r for r, _, _ in small) if remote else 0
                    most = max(r for r, _, _ in small) if remote else 0
                    size = statistics.median(b for _, b, _ in small)
                    secs = statistics.median(t for _, _, t in small) / 1000
                    per, top = reqs / args.partitions, most / args.partitions
                    print(f"{keys:>9,} {name:>12} {reqs:>9.0f} {per:>9.1f} {top:>9.1f} "
                          f"{size:>11,.0f} {secs:>8.2f}")  # fmt: skip
    finally:
        server.stop()
        spark.stop()


if __name__ == "__main__":
    main()
