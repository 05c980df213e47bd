"""Snapshot and restore: blob format, backend independence, corruption, rescaling."""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncio_ops._storage._container import FORMAT_VERSION, HEADER_SIZE
from asyncio_ops._timers import InternalTimerService, Timer
from asyncio_ops.state import (
    AggregatingStateDescriptor,
    CorruptStateError,
    HeapKeyedStateBackend,
    KeyedStateBackend,
    KeyGroupRange,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    RocksDBKeyedStateBackend,
    StateError,
    StateTtlConfig,
    ValueStateDescriptor,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from asyncio_ops.state._blob import KEYED_STATE, unseal
from asyncio_ops.state._keycodec import decode_canonical
from asyncio_ops.testing import ManualClock

from .conftest import BackendFactory
from .test_backends import Average

VALUE = ValueStateDescriptor[Any]("value")
LIST = ListStateDescriptor[Any]("list")
MAP = MapStateDescriptor[Any, Any]("map")
SUM = ReducingStateDescriptor[int]("sum", lambda a, b: a + b)
AVG = AggregatingStateDescriptor("avg", Average())
TTL_VALUE = ValueStateDescriptor[Any]("ttl_value", ttl=StateTtlConfig(100.0, cleanup=()))
TTL_LIST = ListStateDescriptor[Any]("ttl_list", ttl=StateTtlConfig(100.0, cleanup=()))


def fill(backend: KeyedStateBackend, keys: list[Any], *, namespaces: bool = True) -> None:
    """Write one entry of every state kind per key (and a second namespace)."""
    v, lst, m = backend.get_state(VALUE), backend.get_state(LIST), backend.get_state(MAP)
    s, a = backend.get_state(SUM), backend.get_state(AVG)
    tv, tl = backend.get_state(TTL_VALUE), backend.get_state(TTL_LIST)
    w = backend.get_state(VALUE, namespace=("window", 5))
    for i, k in enumerate(keys):
        backend.set_current_key(k)
        v.update({"key": k, "i": i})
        lst.add_all([i, str(i), [i]])
        m.put_all({"a": i, (1, "b"): None})
        s.add(i)
        s.add(1)
        a.add(float(i))
        tv.update(i)
        tl.add(i)
        if namespaces and i % 2:
            w.update(-i)


def read_all(backend: KeyedStateBackend) -> dict[Any, tuple[Any, ...]]:
    """Everything ``fill`` writes, read back through the state API, by key."""
    v, lst, m = backend.get_state(VALUE), backend.get_state(LIST), backend.get_state(MAP)
    s, a = backend.get_state(SUM), backend.get_state(AVG)
    tv, tl = backend.get_state(TTL_VALUE), backend.get_state(TTL_LIST)
    w = backend.get_state(VALUE, namespace=("window", 5))
    out = {}
    for k in backend.keys("value"):
        backend.set_current_key(k)
        out[k] = (
            v.value(),
            lst.get(),
            sorted(m.items(), key=repr),
            s.get(),
            a.get(),
            tv.value(),
            tl.get(),
            w.value(),
        )
    return out


# -- round trips --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "chain", [("heap", "rocksdb", "heap"), ("rocksdb", "heap", "rocksdb")], ids="->".join
)
def test_blobs_are_backend_independent(
    any_backend_factory: Callable[[str], BackendFactory], chain: tuple[str, ...]
) -> None:
    clock = ManualClock(5.0)
    keys = ["a", "b", 3, (4, "x"), None, 2.5]
    first = any_backend_factory(chain[0])(clock=clock)
    fill(first, keys)
    expected = read_all(first)
    assert len(expected) == len(keys)
    blobs = first.snapshot()
    for kind in chain[1:]:
        nxt = any_backend_factory(kind)(clock=clock)
        assert nxt.restore(pickle.loads(pickle.dumps(blobs))) == len(blobs)
        assert read_all(nxt) == expected
        blobs = nxt.snapshot()


def test_restore_before_and_after_get_state_agree(
    make_backend: BackendFactory, clock: ManualClock
) -> None:
    src = make_backend(clock=clock)
    fill(src, list(range(20)))
    blobs = src.snapshot()
    early = make_backend(clock=clock)
    fill(early, [])  # registers every state first: restore writes into live states
    early.restore(blobs)
    late = make_backend(clock=clock)
    late.restore(blobs)  # nothing registered: data waits for get_state
    assert sorted(late.state_names()) == sorted(early.state_names())
    assert sorted(late.keys("list")) == list(range(20))
    assert late.snapshot().keys() == blobs.keys()  # pending data is snapshotted as is
    assert read_all(late) == read_all(early) == read_all(src)


def test_snapshot_of_empty_backend_is_empty(backend: KeyedStateBackend) -> None:
    assert backend.snapshot() == {}
    backend.get_state(VALUE)
    assert backend.snapshot() == {}
    assert backend.restore({}) == 0


def test_one_blob_per_key_group(backend: KeyedStateBackend) -> None:
    keys = list(range(300))
    fill(backend, keys)
    blobs = backend.snapshot()
    assert set(blobs) == {assign_to_key_group(k, 128) for k in keys}
    assert all(isinstance(b, bytes) for b in blobs.values())


def test_every_entry_is_filed_under_its_key_group(backend: KeyedStateBackend) -> None:
    # The heap backend keeps one flat dict per state and namespace and cuts it by key
    # group only at snapshot time: each blob must hold exactly the keys of its group.
    keys: list[Any] = [*range(200), *(f"k{i}" for i in range(200)), (1, "a"), None, 2.5]
    fill(backend, keys)
    for kg, blob in backend.snapshot().items():
        for _name, _kind, _ttl, entries, _typing in unseal(KEYED_STATE, kg, blob):
            for key_enc, _ns, _payload in entries:
                assert assign_to_key_group(decode_canonical(key_enc), 128) == kg


def test_restore_kind_mismatch_is_an_error(make_backend: BackendFactory) -> None:
    src = make_backend()
    src.get_state(ValueStateDescriptor[int]("x"))
    src.set_current_key("k")
    src.get_state(ValueStateDescriptor[int]("x")).update(1)
    blobs = src.snapshot()
    dst = make_backend()
    dst.get_state(ListStateDescriptor[int]("x"))
    with pytest.raises(StateError, match="value state in the snapshot"):
        dst.restore(blobs)
    lazy = make_backend()
    lazy.restore(blobs)
    with pytest.raises(StateError, match="restored as value state"):
        lazy.get_state(ListStateDescriptor[int]("x"))


def test_rocksdb_snapshot_is_a_point_in_time_view(tmp_path: Path) -> None:
    b = RocksDBKeyedStateBackend(
        path=tmp_path / "db", max_parallelism=128, key_group_range=KeyGroupRange(0, 127)
    )
    try:
        fill(b, list(range(50)))
        before = read_all(b)
        pending = b.begin_snapshot()  # phase 1: checkpoint; writes continue afterwards
        fill(b, list(range(50, 80)))
        b.set_current_key(0)
        b.get_state(VALUE).update("changed after the snapshot")
        b.get_state(LIST).clear()
        blobs = pending.materialize()
        with pytest.raises(StateError, match="already"):
            pending.materialize()
        check = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
        check.restore(blobs)
        assert read_all(check) == before
        assert not any((tmp_path / "db" / "snapshots").iterdir())  # checkpoint removed
    finally:
        b.close()


# -- corruption ---------------------------------------------------------------------------
@pytest.fixture
def blobs(make_backend: BackendFactory) -> dict[int, bytes]:
    src = make_backend()
    fill(src, list(range(40)))
    return src.snapshot()


def _corruptions(blob: bytes) -> Iterator[tuple[str, object]]:
    yield "truncated", blob[: len(blob) // 2]
    yield "truncated", blob[: HEADER_SIZE - 1]
    yield "checksum|not a readable", blob[:-1] + bytes([blob[-1] ^ 0x01])
    yield (
        "checksum",
        blob[:HEADER_SIZE] + bytes([blob[HEADER_SIZE] ^ 0x80]) + blob[HEADER_SIZE + 1 :],
    )
    yield "not an asyncio_ops", b"XXXX" + blob[4:]
    yield "format version", blob[:8] + bytes([FORMAT_VERSION + 1]) + blob[9:]
    yield "padded", blob + b"\x00"
    yield "must be bytes", "not a blob"


def test_corrupt_blob_names_the_key_group(
    make_backend: BackendFactory, blobs: dict[int, bytes]
) -> None:
    victim = sorted(blobs)[len(blobs) // 2]
    for what, bad in _corruptions(blobs[victim]):
        dst = make_backend()
        with pytest.raises(CorruptStateError, match=rf"key group {victim}\b.*({what})"):
            dst.restore({**blobs, victim: bad})  # type: ignore[dict-item]
        # verification precedes application: nothing was restored
        assert dst.state_names() == []


def test_blob_filed_under_another_key_group_is_rejected(
    make_backend: BackendFactory, blobs: dict[int, bytes]
) -> None:
    a, b = sorted(blobs)[:2]
    with pytest.raises(
        CorruptStateError, match=rf"key group {a}: blob was written for key group {b}"
    ):
        make_backend().restore({a: blobs[b]})


def test_corrupt_blob_outside_the_range_is_not_read(
    make_backend: BackendFactory, blobs: dict[int, bytes]
) -> None:
    kgr = KeyGroupRange(0, 63)
    inside = {kg: b for kg, b in blobs.items() if kg in kgr}
    outside = next(kg for kg in blobs if kg not in kgr)
    dst = make_backend(key_group_range=kgr)
    assert dst.restore({**blobs, outside: b"garbage"}) == len(inside)


# -- rescaling ------------------------------------------------------------------------------
def instances(
    make: BackendFactory, parallelism: int, maxp: int, clock: ManualClock
) -> list[KeyedStateBackend]:
    return [
        make(
            max_parallelism=maxp,
            key_group_range=compute_key_group_range_for_operator_index(maxp, parallelism, i),
            clock=clock,
        )
        for i in range(parallelism)
    ]


@pytest.mark.parametrize(("old_p", "new_p"), [(2, 3), (3, 2), (1, 4), (4, 1)])
def test_rescale(make_backend: BackendFactory, clock: ManualClock, old_p: int, new_p: int) -> None:
    maxp = 16
    keys = [f"user-{i}" for i in range(200)]
    olds = instances(make_backend, old_p, maxp, clock)
    for b in olds:
        fill(b, [k for k in keys if assign_to_key_group(k, maxp) in b.key_group_range])
    expected: dict[Any, tuple[Any, ...]] = {}
    for b in olds:
        expected.update(read_all(b))
    assert len(expected) == len(keys)
    snaps = [b.snapshot() for b in olds]
    news = instances(make_backend, new_p, maxp, clock)
    got: dict[Any, tuple[Any, ...]] = {}
    for b in news:
        for snap in snaps:  # restore is called once per old instance
            b.restore(snap)
        part = read_all(b)
        assert all(assign_to_key_group(k, maxp) in b.key_group_range for k in part)
        assert not part.keys() & got.keys()
        got.update(part)
    assert got == expected


class _Fired:
    def __init__(self) -> None:
        self.timers: list[Timer] = []

    def on_event_time(self, timer: Timer) -> None:
        self.timers.append(timer)

    def on_processing_time(self, timer: Timer) -> None:
        self.timers.append(timer)


keys_st = st.lists(
    st.one_of(
        st.integers(-(2**40), 2**40),
        st.text(max_size=6),
        st.tuples(st.integers(0, 9), st.text(max_size=2)),
    ),
    max_size=40,
    unique=True,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    keys=keys_st,
    old_p=st.integers(1, 6),
    new_p=st.integers(1, 6),
    maxp=st.sampled_from([6, 16, 128]),
    rocks=st.booleans(),
    timer_ts=st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
)
def test_property_rescale_loses_and_duplicates_nothing(
    keys: list[Any], old_p: int, new_p: int, maxp: int, rocks: bool, timer_ts: list[int]
) -> None:
    """Snapshot at parallelism p, restore at q: every key and every timer exactly once."""
    clock = ManualClock(0.0)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        counter = iter(range(10**6))

        def make(**kw: Any) -> KeyedStateBackend:
            b: KeyedStateBackend
            if rocks:
                b = RocksDBKeyedStateBackend(path=Path(tmp) / str(next(counter)), **kw)
            else:
                b = HeapKeyedStateBackend(**kw)
            stack.callback(b.close)
            return b

        def services(
            backends: list[KeyedStateBackend],
        ) -> list[InternalTimerService]:
            return [
                InternalTimerService(
                    "user-timers",
                    _Fired(),
                    clock=clock,
                    key_context=b,
                    max_parallelism=maxp,
                    key_group_range=b.key_group_range,
                )
                for b in backends
            ]

        olds = instances(make, old_p, maxp, clock)
        old_svcs = services(olds)
        want_timers = set()
        for b, svc in zip(olds, old_svcs, strict=True):
            mine = [k for k in keys if assign_to_key_group(k, maxp) in b.key_group_range]
            fill(b, mine, namespaces=False)
            for k in mine:
                b.set_current_key(k)
                for ts in timer_ts:
                    svc.register_event_time_timer("ns", float(ts))
                    want_timers.add((repr(k), "ns", float(ts)))
        state_snaps = [b.snapshot() for b in olds]
        timer_snaps = [svc.snapshot() for svc in old_svcs]

        news = instances(make, new_p, maxp, clock)
        new_svcs = services(news)
        seen_keys: list[str] = []
        seen_timers: list[tuple[str, Any, float]] = []
        for b, svc in zip(news, new_svcs, strict=True):
            for s in state_snaps:
                b.restore(s)
            for t in timer_snaps:
                svc.restore(t)
            for k, row in read_all(b).items():
                assert assign_to_key_group(k, maxp) in b.key_group_range
                assert row[0]["key"] == k
                seen_keys.append(repr(k))
            svc.advance_watermark(10.0)
            fired = svc._triggerable.timers  # type: ignore[attr-defined]
            seen_timers += [(repr(t.key), t.namespace, t.timestamp) for t in fired]
            svc.close()
        for svc in old_svcs:
            svc.close()
        assert sorted(seen_keys) == sorted(map(repr, keys))  # none lost, none duplicated
        assert len(seen_timers) == len(want_timers)
        assert set(seen_timers) == want_timers
