"""Benchmark of the state layer, each figure beside its raw floor measured in the same run.

Run: ``python bench/state.py`` (``--ops N`` for the per-op loops, ``--timers N``).

Each figure is the best of 5 runs (GC off while timing) of the CPU time of the
process (``time.process_time``: all threads, so RocksDB's background threads
count, for the backend and for the raw floor alike), not wall time: on a
shared, oversubscribed machine wall time mostly measures the other tenants.
``--wall`` measures wall time (``time.perf_counter``) instead.

- value get+update: per op ``set_current_key(k); s.update((s.value() or 0) + 1)``
  over 1,000 distinct keys, against a plain dict doing the same work (heap) and
  raw rocksdict ``cf.put(kb, cf.get(kb))`` on pre-encoded bytes keys and values
  (RocksDB; no pickling in the floor). The heap floor is ``if k not in kg: kg[k]
  = key_group_checked(k)`` then ``d[k] = d.get(k, 0) + 1``: the key -> key-group
  step is work ``set_current_key`` must do (it raises KeyGroupError for a key
  outside the backend's range), done the cheapest plain-dict way (a dict of the
  keys seen, the key group computed on first sight), as the backend does it.
  The same loop without that step ("bare dict") is printed beside, with the same
  40% target. With the C accelerator not built (or ``ASYNCIO_OPS_PURE_PYTHON=1``)
  the heap rows measure the pure-Python fallback; the first line says which.
- value get+update, key kept: ``s.update((s.value() or 0) + 1)`` with the
  current key set once, against ``d[k] = d.get(k, 0) + 1`` (no key-group step
  on either side).
- list add: ``set_current_key(k); s.add(i)`` against the key-group step plus
  ``d[k].append(i)`` (heap; bare dict beside, same target) and one raw ``cf.put`` per element
  (RocksDB).
- snapshot / restore: keys/s for 100,000 keys with a value and a 3-element
  list each (floor: ``pickle.dumps``/``loads`` of the same data as one plain
  dict; keys, not bytes, since the container compresses).
- checkpoint write / read: the same state (and a value per key alone, a
  running count's state, against the pickle of that dict) as a streaming
  checkpoint writes a full snapshot of it (every key group a section of one
  container file) and a cold restore reads it back into an empty backend,
  keys/s against the floors.
- timers: N event-time timers registered on N/10 keys through
  ``InternalTimerService`` (with the heap backend as key context) and fired by
  one watermark, against ``heapq`` push/pop of ``(timestamp, seq, item)``.

Targets: heap >= 40% of the dict floor, RocksDB >= 50% of raw rocksdict.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import itertools
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rocksdict

from asyncio_ops._keygroups import assign_to_key_group
from asyncio_ops._timers import InternalTimerService, Timer
from asyncio_ops.state import (
    HeapKeyedStateBackend,
    KeyedStateBackend,
    KeyGroupRange,
    ListStateDescriptor,
    RocksDBKeyedStateBackend,
    StateError,
    ValueStateDescriptor,
)

ROWS: list[tuple[str, str, str, str, str]] = []


CLOCK: Callable[[], float] = time.process_time


def timed(fn: Callable[[], Any], repeat: int = 5) -> float:
    """Best of ``repeat`` times on ``CLOCK`` (GC off while timing, as timeit does)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = CLOCK()
            fn()
            best = min(best, CLOCK() - t0)
        finally:
            gc.enable()
    return best


def row(name: str, value: float, floor: float, unit: str, target: float | None) -> None:
    ratio = value / floor
    verdict = "" if target is None else ("ok" if ratio >= target else f"BELOW {target:.0%}")
    shown = "{:,.1f}" if value < 100 else "{:,.0f}"  # small rates: one decimal
    ROWS.append((name, f"{shown.format(value)} {unit}", f"{shown.format(floor)} {unit}",
                 f"{ratio:.0%}", verdict))  # fmt: skip


def raw_rocksdb(path: Path) -> tuple[Any, Any]:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    db = rocksdict.Rdict(str(path), opts)
    w = rocksdict.WriteOptions()
    w.disable_wal = True  # as in the backend
    db.set_write_options(w)
    cf = db.create_column_family("raw", rocksdict.Options(raw_mode=True))
    cf.set_write_options(w)
    return db, cf


MAXP = 128
RANGE = KeyGroupRange(0, MAXP - 1)


def key_group_checked(key: Any) -> int:
    """The key group of ``key``, checked against the range (the floor's first-sight step)."""
    kg = assign_to_key_group(key, MAXP)
    if kg not in RANGE:
        raise ValueError(kg)
    return kg


def bench_value(n: int, tmp: Path) -> None:
    keys = [f"user-{i % 1000}" for i in range(n)]

    def floor_dict() -> None:
        kg: dict[str, int] = {}
        d: dict[str, int] = {}
        for k in keys:
            if k not in kg:
                kg[k] = key_group_checked(k)
            d[k] = d.get(k, 0) + 1

    def bare_dict() -> None:
        d: dict[str, int] = {}
        for k in keys:
            d[k] = d.get(k, 0) + 1

    def heap() -> None:
        b = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
        s = b.get_state(ValueStateDescriptor[int]("v"))
        sk, val, upd = b.set_current_key, s.value, s.update
        for k in keys:
            sk(k)
            upd((val() or 0) + 1)

    t_heap = timed(heap)
    row("value get+update, heap", n / t_heap, n / timed(floor_dict), "ops/s", 0.40)
    row("  (vs bare dict, no key-group step)", n / t_heap, n / timed(bare_dict), "ops/s", 0.40)

    # The state access alone: the current key stays set (e.g. several states per record).
    def floor_dict_same_key() -> None:
        d: dict[str, int] = {}
        k = keys[0]
        for _ in keys:
            d[k] = d.get(k, 0) + 1

    def heap_same_key() -> None:
        b = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
        s = b.get_state(ValueStateDescriptor[int]("v"))
        val, upd = s.value, s.update
        b.set_current_key(keys[0])
        for _ in keys:
            upd((val() or 0) + 1)

    row(
        "value get+update, heap, key kept",
        n / timed(heap_same_key),
        n / timed(floor_dict_same_key),
        "ops/s",
        0.40,
    )

    db, cf = raw_rocksdb(tmp / "raw-value")
    bkeys = [k.encode() for k in keys]
    one = pickle.dumps(1, protocol=5)
    for kb in set(bkeys):
        cf.put(kb, one)

    def floor_rocks() -> None:
        get, put = cf.get, cf.put
        for kb in bkeys:
            put(kb, get(kb))

    counter = itertools.count()

    def rocks() -> None:
        b = RocksDBKeyedStateBackend(
            path=tmp / f"value-{next(counter)}",
            max_parallelism=128,
            key_group_range=KeyGroupRange(0, 127),
        )
        s = b.get_state(ValueStateDescriptor[int]("v"))
        sk, val, upd = b.set_current_key, s.value, s.update
        for k in keys:
            sk(k)
            upd((val() or 0) + 1)
        b.close()

    row("value get+update, RocksDB", n / timed(rocks), n / timed(floor_rocks), "ops/s", 0.50)
    cf.close()
    db.close()


def bench_list(n: int, tmp: Path) -> None:
    keys = [f"user-{i % 1000}" for i in range(n)]

    def floor_dict() -> None:
        kg: dict[str, int] = {}
        d: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            if k not in kg:
                kg[k] = key_group_checked(k)
            lst = d.get(k)
            if lst is None:
                d[k] = [i]
            else:
                lst.append(i)

    def bare_dict() -> None:
        d: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            lst = d.get(k)
            if lst is None:
                d[k] = [i]
            else:
                lst.append(i)

    def heap() -> None:
        b = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
        s = b.get_state(ListStateDescriptor[int]("l"))
        sk, add = b.set_current_key, s.add
        for i, k in enumerate(keys):
            sk(k)
            add(i)

    t_heap = timed(heap)
    row("list add, heap", n / t_heap, n / timed(floor_dict), "ops/s", 0.40)
    row("  (vs bare dict, no key-group step)", n / t_heap, n / timed(bare_dict), "ops/s", 0.40)

    counter = itertools.count()
    bkeys = [k.encode() + i.to_bytes(8, "big") for i, k in enumerate(keys)]
    vals = [pickle.dumps(i, protocol=5) for i in range(n)]

    def floor_rocks() -> None:
        db, cf = raw_rocksdb(tmp / f"raw-list-{next(counter)}")
        put = cf.put
        for kb, v in zip(bkeys, vals, strict=True):
            put(kb, v)
        cf.close()
        db.close()

    def rocks() -> None:
        b = RocksDBKeyedStateBackend(
            path=tmp / f"list-{next(counter)}",
            max_parallelism=128,
            key_group_range=KeyGroupRange(0, 127),
        )
        s = b.get_state(ListStateDescriptor[int]("l"))
        sk, add = b.set_current_key, s.add
        for i, k in enumerate(keys):
            sk(k)
            add(i)
        b.close()

    row("list add, RocksDB", n / timed(rocks), n / timed(floor_rocks), "ops/s", 0.50)


N_KEYS = [0]  # the snapshot test's keys, for its rates


def bench_snapshot(n_keys: int, tmp: Path) -> None:
    N_KEYS[0] = n_keys
    keys = [f"user-{i}" for i in range(n_keys)]
    data = {k: (i, [i, i + 1, i + 2]) for i, k in enumerate(keys)}
    counter = itertools.count()

    def fill(b: KeyedStateBackend) -> None:
        v = b.get_state(ValueStateDescriptor[int]("v"))
        lst = b.get_state(ListStateDescriptor[int]("l"))
        for k, (i, items) in data.items():
            b.set_current_key(k)
            v.update(i)
            lst.add_all(items)

    def make(kind: str) -> KeyedStateBackend:
        kgr = KeyGroupRange(0, 127)
        if kind == "heap":
            return HeapKeyedStateBackend(max_parallelism=128, key_group_range=kgr)
        return RocksDBKeyedStateBackend(
            path=tmp / f"snap-{next(counter)}", max_parallelism=128, key_group_range=kgr
        )

    blob = pickle.dumps(data, protocol=5)
    # keys/s: the bytes differ between the sides (the container is compressed)
    floor_dump = n_keys / timed(lambda: pickle.dumps(data, protocol=5))
    floor_load = n_keys / timed(lambda: pickle.loads(blob))
    for kind in ("heap", "rocksdb"):
        _snapshot_restore(kind, make, fill, floor_dump, floor_load)
    for kind in ("heap", "rocksdb"):
        _sections_write_read(kind, make, fill, floor_dump, floor_load, "value and list")

    def fill_values(b: KeyedStateBackend) -> None:  # a running count per key
        v = b.get_state(ValueStateDescriptor[int]("v"))
        for k, (i, _) in data.items():
            b.set_current_key(k)
            v.update(i)

    values = {k: i for k, (i, _) in data.items()}
    blob = pickle.dumps(values, protocol=5)
    floor_dump = n_keys / timed(lambda: pickle.dumps(values, protocol=5))
    floor_load = n_keys / timed(lambda: pickle.loads(blob))
    for kind in ("heap", "rocksdb"):
        _sections_write_read(kind, make, fill_values, floor_dump, floor_load, "value")


def _sections_write_read(
    kind: str,
    make: Callable[[str], KeyedStateBackend],
    fill: Callable[[KeyedStateBackend], None],
    floor_dump: float,
    floor_load: float,
    states: str,
) -> None:
    """What a streaming checkpoint does with the whole state (a full snapshot of every
    key group, a cold restore): the key groups as sections of one container file,
    written and read back into an empty backend."""
    from asyncio_ops._storage._container import Kind, decode, encode
    from asyncio_ops.state._keyed_snapshot import apply_change, key_group_sections

    def timers_of(b: KeyedStateBackend) -> InternalTimerService:
        return InternalTimerService(
            "user-timers", _Count(), key_context=b, max_parallelism=128,
            key_group_range=b.key_group_range, armed=False,
        )  # fmt: skip

    src = make(kind)
    fill(src)
    src_timers = timers_of(src)
    data = [b""]
    targets: list[KeyedStateBackend] = []

    def write() -> None:
        sections = key_group_sections(src, src_timers)  # built as encode takes them
        data[0] = encode(Kind.KEY_GROUPS, sections, "bench/v0/kg")[0]

    def read() -> None:
        dst = make(kind)
        targets.append(dst)
        timers = timers_of(dst)
        for section in decode(data[0], Kind.KEY_GROUPS, "bench", "bench/v0/kg", StateError):
            apply_change(dst, timers, section, "bench")
        dst.get_state(ValueStateDescriptor[int]("v"))  # loads restored data (heap)
        if states != "value":
            dst.get_state(ListStateDescriptor[int]("l"))

    t = timed(write)
    size = len(data[0])
    n = N_KEYS[0]
    row(f"checkpoint write, {states}, {kind} ({size / 1e6:.1f} MB)", n / t, floor_dump,
        "keys/s", None)  # fmt: skip
    t = timed(read)
    row(f"checkpoint read, {states}, {kind}", n / t, floor_load, "keys/s", None)
    for b in [src, *targets]:
        b.close()


def _snapshot_restore(
    kind: str,
    make: Callable[[str], KeyedStateBackend],
    fill: Callable[[KeyedStateBackend], None],
    floor_dump: float,
    floor_load: float,
) -> None:
    src = make(kind)
    fill(src)
    blobs: dict[int, bytes] = {}
    targets: list[KeyedStateBackend] = []

    def snap() -> None:
        blobs.clear()
        blobs.update(src.snapshot())

    def restore() -> None:
        dst = make(kind)
        targets.append(dst)
        dst.restore(blobs)
        dst.get_state(ValueStateDescriptor[int]("v"))  # loads restored data (heap)
        dst.get_state(ListStateDescriptor[int]("l"))

    t = timed(snap)
    size = sum(map(len, blobs.values()))
    n = N_KEYS[0]
    row(f"snapshot, {kind} ({size / 1e6:.1f} MB)", n / t, floor_dump, "keys/s", None)
    t = timed(restore)
    row(f"restore, {kind}", n / t, floor_load, "keys/s", None)
    for b in [src, *targets]:
        b.close()


class _Count:
    def __init__(self) -> None:
        self.n = 0

    def on_event_time(self, timer: Timer) -> None:
        self.n += 1

    def on_processing_time(self, timer: Timer) -> None:  # pragma: no cover - unused
        self.n += 1


def bench_timers(n: int) -> None:
    keys = [f"user-{i}" for i in range(max(1, n // 10))]
    nk = len(keys)

    def floor() -> None:
        h: list[tuple[float, int, Any]] = []
        seq = itertools.count()
        push, pop = heapq.heappush, heapq.heappop
        for i in range(n):
            push(h, (float(i % 997), next(seq), keys[i % nk]))
        while h:
            pop(h)

    fired = _Count()

    def service() -> None:
        backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
        fired.n = 0
        svc = InternalTimerService("user-timers", fired, key_context=backend)
        reg = svc.register_event_time_timer
        for i in range(n):
            reg(None, float(i % 997), keys[i % nk])
        svc.advance_watermark(1e9)
        assert fired.n == n, (fired.n, n)

    t_floor = timed(floor, repeat=1)
    t = timed(service, repeat=1)
    row(f"timers register+fire ({n:,})", n / t, n / t_floor, "timers/s", None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=300_000, help="ops per value/list loop")
    p.add_argument("--keys", type=int, default=100_000, help="keys in the snapshot test")
    p.add_argument("--timers", type=int, default=1_000_000, help="timers registered and fired")
    p.add_argument("--wall", action="store_true", help="wall time instead of process CPU time")
    p.add_argument("--only", choices=("value", "list", "snapshot", "timers"),
                   help="run one part only")  # fmt: skip
    args = p.parse_args()
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    with tempfile.TemporaryDirectory(prefix="bench-state-") as d:
        tmp = Path(d)
        parts: dict[str, Callable[[], None]] = {
            "value": lambda: bench_value(args.ops, tmp),
            "list": lambda: bench_list(args.ops, tmp),
            "snapshot": lambda: bench_snapshot(args.keys, tmp),
            "timers": lambda: bench_timers(args.timers),
        }
        for name, part in parts.items():
            if args.only in (None, name):
                part()
    head = ("benchmark", "asyncio_ops", "raw floor", "ratio", "target")
    widths = [max(len(r[i]) for r in [head, *ROWS]) for i in range(5)]
    clock = "wall time" if args.wall else "process CPU time"
    from asyncio_ops._native import in_use
    from asyncio_ops.state._heap import _heapfast

    heap = "C accelerator" if in_use(_heapfast) else "pure Python (C accelerator off)"
    print(
        f"python {sys.version.split()[0]}; ops={args.ops:,} keys={args.keys:,}; {clock}; "
        f"heap backend: {heap}"
    )
    for r in [head, tuple("-" * w for w in widths), *ROWS]:
        cells = zip(r, widths, strict=True)
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(cells)))


if __name__ == "__main__":
    main()
