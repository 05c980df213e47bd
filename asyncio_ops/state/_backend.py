"""The keyed state backend contract, and what both backends share.

Call order, per operator instance::

    backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=r, clock=c)
    backend.restore(blobs)             0..n times (once per old instance on rescale)
    state = backend.get_state(desc)    any time; restored data of that name is loaded
    backend.assign_key_group(key, kg)  optional: file ``key`` under the key group the engine
                                       computed (Spark's hash in the JVM), before its first use
    backend.assign_key_groups(ks, kgs) or a batch's keys at once (False: assign them one by one)
    backend.set_current_key(key)       per record / per timer (the timer service does it)
    state.value(); state.update(v)     read and write the current key's entry
    backend.advance_watermark(w)       per watermark (event-time TTL)
    backend.on_record()                per record (incremental TTL cleanup)
    backend.snapshot()                 -> {key_group: blob}
    backend.close()

``dump()`` / ``load(groups)`` are ``snapshot()`` / ``restore(blobs)`` without
the sealing: the logical entries per key group, which checkpoint files write
as sections of one container (``asyncio_ops._storage._container``).

Incremental snapshots (a streaming runtime that keeps the backend between
checkpoints)::

    backend.track_changes()            from now on, record every key made current
    backend.track_changes(keys=False)  ... or none: every key group will be written
                                       in full (take_touched() returns none)
    backend.take_touched()             -> the keys made current since (and start afresh)
    backend.dump_keys(keys)            -> {key_group: entries} of exactly those keys
    backend.dump(key_groups)           -> the entries of some key groups, in full
    backend.value_runs(kg)             -> or one key group in full as columns, when every
                                       state is a value state without TTL (None: dump)
    backend.remove_keys(kg, keys)      drop those keys' entries (before a delta's blob is
                                       restored: a delta replaces its keys whole)
    backend.clear_key_group(kg)        drop a key group (before a full blob replaces it)

A bulk load (``track_changes`` begun on a backend holding no row, with
:meth:`~KeyedStateBackend.require_assigned_groups`): no key named since then
has a row it did not write. RocksDB keeps what its value states without TTL
write in memory (a dict per state, by key) instead of a get and a put per
key, and writes it into the database in row-key order, at once, before
anything else reads the database (a snapshot, ``keys``, a restore, parking,
the next ``track_changes``): the database then holds what the puts would
have written.

A key made current counts as changed whether or not its state was written
(reads with TTL ``update_on_read`` write too). Entries deleted by TTL cleanup
of keys that were not made current reach a checkpoint with the key group's
next full snapshot: until then a restore holds them as expired entries, which
state reads never return (nor does the TTL's ``return_expired`` promise them
gone).

What a snapshot is: one sealed blob (a container, see ``_blob``) per non-empty key group,
holding for every state of that group its name, kind and entries in a
backend-independent form (canonical key and namespace bytes, values encoded
with the descriptor's serializer, TTL timestamps). A heap snapshot restores
into RocksDB and back.

Key groups. A key is filed under ``assign_to_key_group(key)`` (the core's
Murmur3 of its canonical bytes) unless :meth:`KeyedStateBackend.assign_key_group`
pinned it to another group: an engine that partitions by its own hash (Spark
computes ``pmod(hash(key columns), max_parallelism)`` in the JVM) hands that
group over with the key, and it is never recomputed in Python. A pinned key
keeps its group for the backend's life (state, snapshots, timers); restoring a
snapshot pins every key to the group it was filed under.

An engine that names the group of *every* key it makes current calls
:meth:`KeyedStateBackend.require_assigned_groups` once: then the backend
remembers a key's group only from one :meth:`~KeyedStateBackend.track_changes`
to the next (the keys of one task, not of the whole state: a restore pins
nothing, and memory does not grow with the keys stored), the timer service
names a timer's group as it fires it, and a key made current with no group
named is a :class:`KeyGroupError`, never the core hash's group (which would
read another group's state).

``restore(blobs)`` takes the blobs of the key groups inside this backend's
range and ignores the others, so it can be given the whole snapshot of every
old instance. It verifies every blob it takes before applying any, so a
corrupt blob (:class:`CorruptStateError` naming the key group) leaves the
backend unchanged. Restored data of a state not yet obtained with
``get_state`` is kept as it came and loaded on first ``get_state``.

One class with one job, the :class:`KeyedStateBackend` contract both backends
implement, with the per-state table and the snapshot helpers they share.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar, overload

from .._clock import SYSTEM_CLOCK, Clock
from .._exceptions import (
    ConfigurationError,
    CorruptStateError,
    IncompatibleStateError,
    KeyGroupError,
    StateError,
    UnsupportedKeyError,
)
from .._keygroups import KeyGroupRange, canonical_bytes, check_parallelism
from ._api import AggregatingState, ListState, MapState, ReducingState, State, ValueState
from ._blob import KEYED_STATE, seal, unseal
from ._descriptors import (
    AGGREGATING,
    KINDS,
    LIST,
    MAP,
    REDUCING,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from ._keycodec import byte_rows, decode_canonical, encoded_key_group, int_key_rows, key_prefix
from ._payloads import ValueRun
from ._serializers import PickleSerializer
from ._ttl import IncrementalCleanup, StateTtlConfig
from ._typed_states import checker, typed_state
from ._types import StateType, evolution

__all__ = ["KeyedStateBackend"]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
IN = TypeVar("IN")
OUT = TypeVar("OUT")

_NEG_INF: Final = float("-inf")
_KEY_CACHE_LIMIT: Final = 1 << 16
# Types whose every value has a canonical encoding (``canonical_bytes`` never refuses one):
# a key of these whose group the engine named needs no encoding to be validated, and the
# heap backend, which files keys by the key itself, encodes it only in a snapshot.
_ALWAYS_ENCODABLE: Final = frozenset({int, str, bytes, float, bool, type(None)})


class _NoKey:
    """The current key before any ``set_current_key``: unhashable on purpose.

    A heap state looks the current key up in a dict with no "is there a key"
    check; with this sentinel that lookup raises TypeError, which the state
    turns into a clear StateError (zero cost on the hot path in CPython 3.11+).
    """

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<no current key>"


NO_KEY: Final = _NoKey()

# Logical snapshot entries (see the module docstring):
#   value, reducing, aggregating: (key_enc, ns_enc, (ts | None, value_bytes))
#   list:                         (key_enc, ns_enc, [(ts | None, element_bytes), ...])
#   map:                          (key_enc, ns_enc, [(map_key_enc, ts | None, value_bytes), ...])
# A typed state's values are its normalised Python values instead of bytes, and its dump
# names its types (the value type and, map state, the key type); None: untyped.
Entry = tuple[bytes, bytes, Any]
Typing = tuple[StateType, StateType | None] | None
StateDump = tuple[str, str, bool, list[Entry], Typing]


def no_current_key() -> StateError:
    return StateError("no current key: call backend.set_current_key(key) before using state")


def _naming_dumps(dumps: Callable[[Any], bytes], name: str) -> Callable[[Any], bytes]:
    """``dumps`` whose failures name the state and the value's type (not a bare TypeError)."""

    def checked(value: Any) -> bytes:
        try:
            return dumps(value)
        except Exception as exc:
            raise StateError(
                f"state {name!r}: a value of type {type(value).__module__}."
                f"{type(value).__qualname__} cannot be serialised: {exc}"
            ) from exc

    return checked


class TableBase:
    """What every backend keeps per registered state: descriptor, TTL, cleanup cursor."""

    def __init__(self, backend: KeyedStateBackend, descriptor: StateDescriptor) -> None:
        self.backend = backend
        self.descriptor = descriptor
        self.name = descriptor.name
        self.kind = descriptor.kind
        self.serializer = descriptor.serializer
        self.value_type = descriptor.value_type
        self.key_type = descriptor.key_type
        self.typing: Typing = None
        self.dumps: Callable[[Any], bytes]
        self.loads: Callable[[Any], Any]
        self.fit: Callable[[Any], Any] | None = None  # typed reducing / aggregating state
        if descriptor.value_type is not None:  # bytes of a RocksDB working copy, no pickle
            self.typing = (descriptor.value_type, descriptor.key_type)
            self.dumps = descriptor.value_type.encode
            self.loads = descriptor.value_type.decode
            if descriptor.kind in (REDUCING, AGGREGATING):
                what = "reduced value" if descriptor.kind == REDUCING else "accumulator"
                self.fit = checker(
                    descriptor.name, descriptor.value_type, what, backend.get_current_key
                )
        else:
            self.dumps = _naming_dumps(descriptor.serializer.dumps, descriptor.name)
            self.loads = descriptor.serializer.loads
        # ``dumps`` without the wrapper that names a failure: a hot path calls it, and on
        # an exception calls ``dumps`` to raise the named error
        self.unnamed_dumps: Callable[[Any], bytes] = (
            descriptor.serializer.dumps if self.typing is None else self.dumps
        )
        ttl: StateTtlConfig | None = descriptor.ttl
        self.ttl_config = ttl
        self.has_ttl = ttl is not None
        self.ttl = ttl.ttl if ttl is not None else math.inf
        self.update_on_read = ttl is not None and ttl.update_on_read
        self.return_expired = ttl is not None and ttl.return_expired
        self.event_time = ttl is not None and ttl.event_time
        rocks = backend.is_rocksdb
        inc: IncrementalCleanup | None = ttl.incremental(rocksdb=rocks) if ttl else None
        self.incremental = inc.cleanup_size if inc is not None else 0
        self.per_record = inc is not None and inc.run_for_every_record
        self.full_snapshot_cleanup = ttl is not None and ttl.full_snapshot_cleanup()
        comp = ttl.compaction(rocksdb=rocks) if ttl else None
        self.compaction_every = comp.query_time_after_num_entries if comp is not None else 0

    def dump_values(self, values: list[Any]) -> list[bytes]:
        """``[self.dumps(v) for v in values]`` (a snapshot's values), without a Python frame
        per value: the serializer's own ``dumps`` (a failure is raised by ``self.dumps``,
        naming the state), and with the default pickle serializer each distinct ``int``
        pickled once when they repeat (a bulk load's counts: equal ints pickle alike)."""
        raw = self.unnamed_dumps
        if type(self.serializer) is PickleSerializer and set(map(type, values)) == {int}:
            distinct = set(values)
            if 2 * len(distinct) <= len(values):
                memo = {v: raw(v) for v in distinct}
                return list(map(memo.__getitem__, values))
        try:
            return list(map(raw, values))
        except Exception:
            return list(map(self.dumps, values))  # the value that fails, named

    def now(self) -> float:
        """The TTL time of this state: processing time, or the watermark (0 without TTL)."""
        if not self.has_ttl:
            return 0.0
        if self.event_time:
            return self.backend._watermark
        return self.backend._clock.now()

    def expired(self, ts: float, now: float) -> bool:
        if self.event_time:
            if now == _NEG_INF:
                return False  # nothing expires before the first watermark
            if ts == _NEG_INF:
                ts = self.backend._first_watermark
        return ts + self.ttl <= now

    def cleanup_step(self) -> None:
        """Check up to ``incremental`` entries for expiry (backend-specific)."""


class KeyedStateBackend(ABC):
    """Keyed state of one operator instance over a key-group range (see module docstring).

    Example:

    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, KeyedStateBackend, ValueStateDescriptor)
    >>> backend = HeapKeyedStateBackend(max_parallelism=128,
    ...                                 key_group_range=KeyGroupRange(64, 127))
    >>> isinstance(backend, KeyedStateBackend), backend.key_group_of("user-1")
    (True, 70)
    >>> seen = backend.get_state(ValueStateDescriptor("seen"))
    >>> backend.set_current_key("user-1")  # a key of this backend's range
    >>> seen.update(True)
    >>> backend.get_current_key(), backend.state_names(), list(backend.keys("seen"))
    ('user-1', ['seen'], ['user-1'])
    >>> backend.close()
    """

    is_rocksdb: bool = False

    def __init__(
        self,
        *,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None = None,
    ) -> None:
        check_parallelism(max_parallelism)
        if not isinstance(key_group_range, KeyGroupRange):
            raise ConfigurationError(
                f"key_group_range must be a KeyGroupRange, got {key_group_range!r}"
            )
        if key_group_range and key_group_range.end >= max_parallelism:
            raise KeyGroupError(
                f"key_group_range {key_group_range.start}..{key_group_range.end} exceeds "
                f"max_parallelism {max_parallelism}"
            )
        if clock is not None and not callable(getattr(clock, "now", None)):
            raise ConfigurationError(f"clock must have now() -> seconds, got {clock!r}")
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self._kg_start = key_group_range.start
        self._kg_end = key_group_range.end  # below start: the empty range
        self._n_groups = len(key_group_range)
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._key: Any = NO_KEY
        self._kprefix: bytes | None = None
        self._key_cache: dict[Any, tuple[int, bytes]] = {}
        # Keys filed under a key group other than the core hash's (assign_key_group); with
        # require_assigned_groups, every key named since the last track_changes().
        self._assigned: dict[Any, int] = {}
        self._require_assigned = False
        # ``_fresh``: a bulk load (module docstring): the backend held nothing when
        # track_changes began and nothing was restored since, so every row it holds was
        # written since (RocksDB: its value states' writes are held in memory meanwhile).
        self._fresh = False
        self._watermark = _NEG_INF
        self._first_watermark = _NEG_INF
        self._tables: dict[str, TableBase] = {}
        self._states: dict[tuple[str, Any], State] = {}
        self._per_record: list[TableBase] = []
        # Restored data of states not yet registered: name -> (kind, {kg: [entries]}, typing).
        self._pending: dict[str, tuple[str, dict[int, list[Entry]], Typing]] = {}
        # Keys made current since take_touched() (None: not recording; track_changes)
        self._touched: set[Any] | None = None
        self._tracking = False  # track_changes() was called (with keys or without)
        self._closed = False

    # -- current key ------------------------------------------------------------------
    def set_current_key(self, key: Any) -> None:
        """Make ``key`` the key that state reads and writes.

        Raises :class:`UnsupportedKeyError` for a key with no canonical encoding
        and :class:`KeyGroupError` for a key outside this backend's key-group
        range; the current key is unchanged then.
        """
        # The hot path of every record and timer: one dict lookup of a per-key cache
        # (key group index, RocksDB row prefix) and two attribute stores. The heap
        # backend overrides this with a cheaper version (its states need only the key).
        try:
            self._kprefix = self._key_cache[key][1]
        except KeyError:
            self._kprefix = self._new_key_entry(key)[1]
        except TypeError:  # unhashable: canonical_bytes names the type
            canonical_bytes(key)
            raise UnsupportedKeyError(  # pragma: no cover - hashable tuple of unhashables
                f"key {key!r} is not hashable"
            ) from None
        self._key = key
        if self._touched is not None:
            self._touched.add(key)

    def _new_key_entry(self, key: Any) -> tuple[int, bytes]:
        kg = self._assigned.get(key) if type(key) in _ALWAYS_ENCODABLE else None
        # the heap needs no row prefix: a key whose group is named and whose type always
        # encodes is valid as it is (its bytes are computed by the snapshot that writes it)
        enc = b"" if kg is not None and not self.is_rocksdb else canonical_bytes(key)
        if kg is None:
            kg = self._assigned.get(key)
        if kg is None:
            if self._require_assigned:
                raise KeyGroupError(
                    f"key {key!r}: no key group was assigned to it (this backend takes every "
                    "key's group from the engine: assign_key_group before making it current)"
                )
            kg = encoded_key_group(enc, self.max_parallelism)
        if kg not in self.key_group_range:
            r = self.key_group_range
            raise KeyGroupError(
                f"key {key!r} is in key group {kg}, outside this backend's key-group range "
                f"{r.start}..{r.end} (max_parallelism {self.max_parallelism}): the input was "
                "not partitioned by key group"
            )
        # The row prefix is for RocksDB; the heap backend needs only the validation.
        entry = (kg - self._kg_start, key_prefix(kg, enc) if self.is_rocksdb else b"")
        cache = self._key_cache
        if len(cache) >= _KEY_CACHE_LIMIT:
            cache.clear()  # bounded memory; a miss costs one hash, not correctness
        cache[key] = entry
        return entry

    def assign_key_group(self, key: Any, key_group: int) -> None:
        """File ``key`` under ``key_group`` (computed by the engine) instead of the core hash.

        Call before the key's first use. :class:`KeyGroupError` if ``key_group`` is
        outside this backend's range, or if ``key`` is already pinned to another
        group; :class:`UnsupportedKeyError` for a key with no canonical encoding
        (with :meth:`require_assigned_groups`: when it is made current).
        """
        if type(key_group) is not int or not self._kg_start <= key_group <= self._kg_end:
            canonical_bytes(key)  # an unsupported key is named first
            r = self.key_group_range
            raise KeyGroupError(
                f"key {key!r}: key group {key_group!r} is outside this backend's key-group "
                f"range {r.start}..{r.end} (max_parallelism {self.max_parallelism})"
            )
        if self._require_assigned:  # per row: no encoding, no hash (set_current_key checks)
            try:
                pinned = self._assigned.get(key)
            except TypeError:  # unhashable: canonical_bytes names the type
                canonical_bytes(key)
                raise UnsupportedKeyError(f"key {key!r} is not hashable") from None
            if pinned is None:
                cache = self._key_cache
                cached = cache.get(key)
                if cached is None and type(key) in _ALWAYS_ENCODABLE:
                    # valid as it is: filed now, so that making it current finds it cached
                    self._assigned[key] = key_group
                    if len(cache) >= _KEY_CACHE_LIMIT:
                        cache.clear()
                    cache[key] = (
                        key_group - self._kg_start,
                        key_prefix(key_group, canonical_bytes(key)) if self.is_rocksdb else b"",
                    )
                    return
                if cached is None or cached[0] + self._kg_start == key_group:
                    self._assigned[key] = key_group
                    return
                pinned = cached[0] + self._kg_start
        else:
            enc = canonical_bytes(key)
            pinned = self._assigned.get(key)
        if pinned == key_group:
            return
        if pinned is not None:
            raise KeyGroupError(
                f"key {key!r} is filed under key group {pinned}; it cannot move to {key_group}"
            )
        if encoded_key_group(enc, self.max_parallelism) == key_group:
            return  # the core hash agrees: nothing to remember
        self._assigned[key] = key_group
        if self._key_cache.pop(key, None) is not None and self._key == key:
            self._key = key  # the current key: refresh its cached group

    def assign_key_groups(self, keys: Sequence[Any], key_groups: Sequence[int]) -> bool:
        """:meth:`assign_key_group` of each ``(keys[i], key_groups[i])`` in order, in a few
        passes in C instead of a call per key, when the batch is the common case: with
        :meth:`require_assigned_groups`, every key of a type that always encodes (int, str,
        bytes, float, bool, None), every group an int inside the range, and no key named
        with another group (in the batch, or before). Then True; otherwise False and
        nothing is assigned: the caller assigns key by key, and the call that fails names
        its key."""
        if not self._require_assigned:
            return False
        if not keys:
            return True
        start = self._kg_start
        if set(map(type, key_groups)) != {int} or not set(map(type, keys)) <= _ALWAYS_ENCODABLE:
            return False
        if min(key_groups) < start or max(key_groups) > self._kg_end:
            return False
        named = dict(zip(keys, key_groups, strict=True))
        if len(named) != len(keys) and list(map(named.__getitem__, keys)) != list(key_groups):
            return False  # a key with two groups: its second call fails
        assigned, cache = self._assigned, self._key_cache
        for key in named.keys() & assigned.keys():
            if assigned[key] != named[key]:
                return False
        for key in named.keys() & cache.keys():
            if cache[key][0] + start != named[key]:
                return False
        assigned.update(named)
        if len(cache) + len(named) > _KEY_CACHE_LIMIT:
            cache.clear()  # bounded memory (by a batch at most); a miss costs a lookup
        if self.is_rocksdb:  # each key's row prefix, as arrays for integer keys
            ks, kgs = list(named), list(named.values())
            rows = int_key_rows(ks, kgs)
            prefixes = (
                byte_rows(rows) if rows is not None
                else list(map(key_prefix, kgs, map(canonical_bytes, ks)))
            )  # fmt: skip
            cache.update(
                zip(ks, zip([kg - start for kg in kgs], prefixes, strict=True), strict=True)
            )
        else:
            entries = {kg: (kg - start, b"") for kg in set(named.values())}
            cache.update(zip(named, map(entries.__getitem__, named.values()), strict=True))
        return True

    def key_group_of(self, key: Any) -> int:
        """The key group ``key``'s state is filed under (KeyGroupError outside the range)."""
        entry = self._key_cache.get(key)
        if entry is None:
            entry = self._new_key_entry(key)
        return entry[0] + self._kg_start

    def get_current_key(self) -> Any:
        """The current key (None before the first ``set_current_key``)."""
        key = self._key
        return None if key is NO_KEY else key

    @property
    def current_key_group(self) -> int | None:
        key = self._key
        if key is NO_KEY:
            return None
        return self.key_group_of(key)

    # -- time -------------------------------------------------------------------------
    def advance_watermark(self, watermark: float) -> None:
        """The event time of event-time TTL; never moves backwards."""
        if watermark > self._watermark:
            if self._first_watermark == _NEG_INF:
                self._first_watermark = watermark
            self._watermark = watermark

    def current_watermark(self) -> float:
        return self._watermark

    def on_record(self) -> None:
        """Per processed record: incremental TTL cleanup with ``run_for_every_record``."""
        for table in self._per_record:
            table.cleanup_step()

    @property
    def cleaned_per_record(self) -> Sequence[TableBase]:
        """The states :meth:`on_record` cleans up (live: a state registered later joins
        it), so a caller of many records calls it only while this is not empty."""
        return self._per_record

    # -- states -----------------------------------------------------------------------
    @overload
    def get_state(
        self, descriptor: ValueStateDescriptor[T], namespace: Any = None
    ) -> ValueState[T]: ...
    @overload
    def get_state(
        self, descriptor: ListStateDescriptor[T], namespace: Any = None
    ) -> ListState[T]: ...
    @overload
    def get_state(
        self, descriptor: MapStateDescriptor[K, V], namespace: Any = None
    ) -> MapState[K, V]: ...
    @overload
    def get_state(
        self, descriptor: ReducingStateDescriptor[T], namespace: Any = None
    ) -> ReducingState[T]: ...
    @overload
    def get_state(
        self, descriptor: AggregatingStateDescriptor[IN, OUT], namespace: Any = None
    ) -> AggregatingState[IN, OUT]: ...
    @overload
    def get_state(self, descriptor: StateDescriptor, namespace: Any = None) -> State: ...

    def get_state(self, descriptor: StateDescriptor, namespace: Any = None) -> State:
        """The state of ``descriptor`` in ``namespace`` (default None), for the current key.

        The same (name, namespace) returns the same object. A second descriptor
        of the same name must have the same kind, TTL and type (StateError
        otherwise). Namespaces need a canonical encoding, like keys. Restored data
        of a typed state declared with another compatible type is converted into
        it (``_types.evolution``); an incompatible one raises IncompatibleStateError.
        """
        self._check_open()
        if not isinstance(descriptor, StateDescriptor) or descriptor.kind not in KINDS:
            raise ConfigurationError(f"not a state descriptor: {descriptor!r}")
        try:
            state = self._states.get((descriptor.name, namespace))
        except TypeError:
            canonical_bytes(namespace)
            raise
        table = self._tables.get(descriptor.name)
        if table is not None:
            d = table.descriptor
            if (
                d.kind != descriptor.kind or d.ttl != descriptor.ttl
                or d.value_type != descriptor.value_type or d.key_type != descriptor.key_type
            ):  # fmt: skip
                raise StateError(
                    f"state {descriptor.name!r} is registered as {d.kind} state "
                    f"(ttl={d.ttl!r}, type={d.value_type}); cannot get it as "
                    f"{descriptor.kind} state (ttl={descriptor.ttl!r}, "
                    f"type={descriptor.value_type})"
                )
        if state is not None:
            return state
        canonical_bytes(namespace)  # fail early on an unsupported namespace
        if table is None:
            pending = self._pending.get(descriptor.name)
            convert = None
            if pending is not None:
                if pending[0] != descriptor.kind:
                    raise StateError(
                        f"state {descriptor.name!r} was restored as {pending[0]} state; "
                        f"cannot get it as {descriptor.kind} state"
                    )
                convert = _evolve(descriptor.name, pending[0], pending[2], _typing(descriptor))
                del self._pending[descriptor.name]
            table = self._create_table(descriptor)
            self._tables[descriptor.name] = table
            if table.per_record:
                self._per_record.append(table)
            if pending is not None:
                for kg, entries in pending[1].items():
                    self._load_entries(table, kg, _converted(table.kind, entries, convert))
        state = self._make_state(table, namespace)
        if table.typing is not None:
            state = typed_state(state, descriptor, self.get_current_key)
        self._states[(descriptor.name, namespace)] = state
        return state

    def state_names(self) -> list[str]:
        """Names of the registered and the restored-but-not-yet-registered states."""
        return sorted(set(self._tables) | set(self._pending))

    def state_types(self) -> dict[str, tuple[str, StateType | None, StateType | None]]:
        """``{state: (kind, value type, map key type)}`` of every registered and restored
        state (types None: untyped), what a checkpoint's manifest records."""
        out = {name: (t.kind, t.value_type, t.key_type) for name, t in self._tables.items()}
        for name, (kind, _, typing) in self._pending.items():
            out[name] = (kind, *(typing if typing is not None else (None, None)))
        return out

    def unclaimed_state_names(self) -> list[str]:
        """Names of restored states no descriptor has registered (yet).

        Their data is kept as restored and goes into every snapshot, so a
        descriptor registered later (or a function rolled back to the old
        name) still finds it.
        """
        return sorted(self._pending)

    def keys(self, state_name: str, namespace: Any = None) -> Iterator[Any]:
        """Keys with an entry in ``state_name`` and ``namespace``, each once.

        Expired TTL entries not yet cleaned up count. Keys come back as stored:
        the RocksDB backend and restored states yield canonical representatives
        (``True`` stored comes back as ``1``). Don't write state while iterating.
        """
        self._check_open()
        table = self._tables.get(state_name)
        if table is not None:
            return self._keys(table, namespace)
        pending = self._pending.get(state_name)
        if pending is None:
            return iter(())
        ns_enc = canonical_bytes(namespace)
        return iter(
            dict.fromkeys(
                decode_canonical(k)
                for entries in pending[1].values()
                for k, ns, _ in entries
                if ns == ns_enc
            )
        )

    # -- snapshot / restore -----------------------------------------------------------
    def snapshot(self, key_groups: Collection[int] | None = None) -> dict[int, bytes]:
        """``{key_group: blob}`` for every non-empty key group of this backend (of
        ``key_groups`` only, if given): :meth:`dump`, sealed (``_blob``)."""
        return seal_dumps(self.dump(key_groups))

    def dump(self, key_groups: Collection[int] | None = None) -> dict[int, list[StateDump]]:
        """``{key_group: [(state, kind, has_ttl, entries, typing), ...]}``: the logical entries of
        every non-empty key group (of ``key_groups`` only, if given), what a snapshot
        holds (:meth:`load` takes it back).

        An event-time TTL entry written before the first watermark has no time
        of its own (its TTL runs from the first watermark): once there is one,
        the snapshot stamps such entries with it, so that a restored backend,
        whose own first watermark comes later, expires them on time.
        """
        self._check_open()
        return self._merger()(self._dump_groups(key_groups), self._pending_dumps(key_groups))

    def value_runs(self, key_group: int) -> list[ValueRun] | None:
        """Key group ``key_group``'s full state as columns, the entries :meth:`dump` gives
        for it in their order, when it can be built so (every state of the backend
        value-like without TTL and every key an integer: the heap backend), for
        ``_payloads.value_key_group_table``; None: take :meth:`dump`'s entries."""
        return None

    def _merger(self) -> Callable[..., dict[int, list[StateDump]]]:
        """What merges this backend's dumps now: :func:`merge_dumps`, with entries written
        before the first watermark stamped with it once there is one."""
        first = self._first_watermark
        if first == _NEG_INF:
            return merge_dumps

        def merge(*parts: dict[int, list[StateDump]]) -> dict[int, list[StateDump]]:
            for part in parts:
                _stamp_unstamped(part, first)
            return merge_dumps(*parts)

        return merge

    def _pending_dumps(
        self, key_groups: Collection[int] | None = None
    ) -> dict[int, list[StateDump]]:
        groups: dict[int, list[StateDump]] = {}
        for name, (kind, by_kg, typing) in self._pending.items():
            for kg, entries in by_kg.items():
                if key_groups is not None and kg not in key_groups:
                    continue
                groups.setdefault(kg, []).append((name, kind, False, list(entries), typing))
        return groups

    def restore(self, blobs: Mapping[int, bytes]) -> int:
        """Take the key groups of ``blobs`` inside this backend's range; returns how many.

        Every taken blob is verified before any is applied (CorruptStateError
        names the key group); then as :meth:`load`.
        """
        self._check_open()
        decoded: dict[int, list[StateDump]] = {}
        for kg, blob in blobs.items():
            if not isinstance(kg, int) or kg not in self.key_group_range:
                continue
            decoded[kg] = unseal(KEYED_STATE, kg, blob)
        return self.load(decoded)

    def load(self, groups: Mapping[int, list[StateDump]]) -> int:
        """Take the key groups of ``groups`` (what :meth:`dump` gives, read back from a
        verified snapshot) inside this backend's range; returns how many.

        Restoring a key group that already holds data merges into it: values and
        map entries are overwritten, list elements appended.
        """
        self._check_open()
        self._fresh = False
        decoded = [
            (kg, dumps) for kg, dumps in groups.items()
            if isinstance(kg, int) and kg in self.key_group_range
        ]  # fmt: skip
        maxp = self.max_parallelism
        for kg, dumps in decoded if not self._require_assigned else ():
            for dump in dumps:  # every key keeps the group it was filed under
                for entry in dump[3] if isinstance(dump, tuple) and len(dump) == 5 else ():
                    if encoded_key_group(entry[0], maxp) != kg:
                        self._assigned.setdefault(decode_canonical(entry[0]), kg)
        for kg, dumps in decoded:
            for dump in dumps:
                try:
                    name, kind, _has_ttl, entries, typing = dump
                except (TypeError, ValueError) as exc:
                    raise CorruptStateError(
                        f"key group {kg}: malformed state entry in snapshot"
                    ) from exc
                if kind not in KINDS:
                    raise CorruptStateError(f"key group {kg}: unknown state kind {kind!r}")
                table = self._tables.get(name)
                if table is not None:
                    if table.kind != kind:
                        raise StateError(
                            f"key group {kg}: state {name!r} is {table.kind} state here but "
                            f"{kind} state in the snapshot"
                        )
                    if typing != table.typing:
                        convert = _evolve(name, kind, typing, table.typing)
                        entries = _converted(kind, entries, convert)
                    self._load_entries(table, kg, entries)
                    continue
                pending = self._pending.setdefault(name, (kind, {}, typing))
                if pending[0] != kind:
                    raise StateError(
                        f"key group {kg}: state {name!r} is restored as both {pending[0]} "
                        f"and {kind} state"
                    )
                if pending[2] != typing:  # sections written before and after a change
                    try:  # of the descriptor's type: all in the newer (wider) one
                        entries = _converted(kind, entries, _evolve(name, kind, typing, pending[2]))
                    except IncompatibleStateError:
                        convert = _evolve(name, kind, pending[2], typing)
                        pending = self._pending[name] = (kind, {
                            g: _converted(kind, es, convert) for g, es in pending[1].items()
                        }, typing)  # fmt: skip
                pending[1].setdefault(kg, []).extend(entries)
        return len(decoded)

    # -- incremental snapshots (module docstring) --------------------------------------
    def require_assigned_groups(self) -> None:
        """From now on the engine names the group of every key it makes current (see the
        module docstring): a restore pins no key, :meth:`track_changes` forgets the
        groups named before it, and a key with no group named is a KeyGroupError."""
        self._require_assigned = True

    @property
    def requires_assigned_groups(self) -> bool:
        """Whether :meth:`require_assigned_groups` was called."""
        return self._require_assigned

    def track_changes(self, keys: bool = True) -> None:
        """Record every key made current from now on (see :meth:`take_touched`); with
        :meth:`require_assigned_groups`, forget the groups named so far. ``keys=False``:
        record none (:meth:`take_touched` returns none until the next call), for a
        snapshot that writes every key group in full: a set of every key a bulk
        micro-batch made current would cost about 30 bytes a key for nothing."""
        self._touched = set() if keys else None
        self._tracking = True
        if self._require_assigned:
            self._assigned.clear()
        self._fresh = self._require_assigned and self._holds_nothing()
        if self._fresh:  # from now on a key is made current only once named (cached then)
            self._key_cache.clear()
            self._key, self._kprefix = NO_KEY, None

    def _holds_nothing(self) -> bool:
        """True if the backend holds no row of any state (checked where a lookup of a key
        it never had costs more than this check: RocksDB)."""
        return False

    def take_touched(self) -> set[Any]:
        """The keys made current since tracking began or since the last call (none if
        :meth:`track_changes` was told not to record them)."""
        if not self._tracking:
            raise StateError("take_touched() needs track_changes() first")
        touched = self._touched
        if touched is None:
            return set()
        self._touched = set()
        return touched

    def encoded_keys(
        self, keys: Iterable[Any], skip: Collection[int] = ()
    ) -> dict[int, list[tuple[Any, bytes]]]:
        """``{key_group: [(key, canonical bytes), ...]}`` of ``keys`` (but those of the key
        groups in ``skip``), sorted by bytes."""
        out: dict[int, list[tuple[Any, bytes]]] = {}
        group_of = self.key_group_of
        for key in keys:
            kg = group_of(key)
            if kg not in skip:
                out.setdefault(kg, []).append((key, canonical_bytes(key)))
        for pairs in out.values():
            pairs.sort(key=_second)
        return out

    def dump_keys(
        self, keys: Mapping[int, Sequence[tuple[Any, bytes]]]
    ) -> dict[int, list[StateDump]]:
        """The logical entries (as :meth:`dump`) of the given keys (``{kg: [(key,
        canonical bytes), ...]}``, as :meth:`encoded_keys` gives) in every state and
        namespace; a key group whose keys hold nothing is left out."""
        self._check_open()
        wanted = {kg: {enc for _, enc in pairs} for kg, pairs in keys.items()}
        pending: dict[int, list[StateDump]] = {}
        for kg, dumps in self._pending_dumps(wanted).items():
            kept = [(n, k, t, [e for e in es if e[0] in wanted[kg]], ty)
                    for n, k, t, es, ty in dumps]  # fmt: skip
            pending[kg] = kept
        return self._merger()(self._dump_keys(keys), pending)

    def remove_keys(self, key_group: int, keys: Sequence[tuple[Any, bytes]]) -> None:
        """Drop every entry of ``keys`` (``(key, canonical bytes)`` pairs of ``key_group``)."""
        self._check_open()
        if key_group not in self.key_group_range or not keys:
            return
        self._remove_keys(key_group, keys)
        encs = {enc for _, enc in keys}
        for _kind, by_kg, _typing in self._pending.values():
            entries = by_kg.get(key_group)
            if entries:
                by_kg[key_group] = [e for e in entries if e[0] not in encs]

    def clear_key_group(self, key_group: int) -> None:
        """Drop every entry of ``key_group``."""
        self._check_open()
        if key_group not in self.key_group_range:
            return
        self._clear_key_group(key_group)
        for _kind, by_kg, _typing in self._pending.values():
            by_kg.pop(key_group, None)

    # -- lifecycle --------------------------------------------------------------------
    def close(self) -> None:
        """Release resources; the backend is unusable afterwards. Idempotent."""
        self._closed = True
        self._states.clear()
        self._tables.clear()
        self._pending.clear()
        self._per_record.clear()
        self._assigned.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise StateError(f"{type(self).__name__} is closed")

    def __enter__(self) -> KeyedStateBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- backend specifics ------------------------------------------------------------
    @abstractmethod
    def _create_table(self, descriptor: StateDescriptor) -> TableBase: ...

    @abstractmethod
    def _make_state(self, table: Any, namespace: Any) -> State: ...

    @abstractmethod
    def _keys(self, table: Any, namespace: Any) -> Iterator[Any]: ...

    @abstractmethod
    def _dump_groups(self, key_groups: Collection[int] | None = None) -> dict[int, list[StateDump]]:
        """Logical entries of every registered state, by key group (of ``key_groups``)."""

    @abstractmethod
    def _dump_keys(
        self, keys: Mapping[int, Sequence[tuple[Any, bytes]]]
    ) -> dict[int, list[StateDump]]:
        """Logical entries of some keys in every registered state, by key group."""

    @abstractmethod
    def _remove_keys(self, key_group: int, keys: Sequence[tuple[Any, bytes]]) -> None:
        """Drop the entries of ``keys`` from every registered state."""

    @abstractmethod
    def _clear_key_group(self, key_group: int) -> None:
        """Drop every entry of ``key_group`` from every registered state."""

    @abstractmethod
    def _load_entries(self, table: Any, kg: int, entries: list[Entry]) -> None:
        """Write logical entries (of key group ``kg``) into a registered state."""


def merge_dumps(*parts: dict[int, list[StateDump]]) -> dict[int, list[StateDump]]:
    """``parts`` merged per key group, states without entries (and key groups without
    states) left out."""
    merged: dict[int, list[StateDump]] = {}
    for part in parts:
        for kg, dumps in part.items():
            merged.setdefault(kg, []).extend(d for d in dumps if d[3])
    return {kg: dumps for kg, dumps in sorted(merged.items()) if dumps}


def seal_dumps(groups: Mapping[int, list[StateDump]]) -> dict[int, bytes]:
    """``{key_group: blob}`` of :meth:`KeyedStateBackend.dump`'s entries."""
    return {kg: seal(KEYED_STATE, kg, dumps) for kg, dumps in groups.items()}


def _stamp_unstamped(groups: dict[int, list[StateDump]], stamp: float) -> None:
    """Give TTL entries stamped -inf (written before the first watermark) ``stamp``."""
    for dumps in groups.values():
        for i, (name, kind, has_ttl, entries, typing) in enumerate(dumps):
            if not has_ttl:
                continue
            fixed: list[Entry] = []
            for key_enc, ns_enc, payload in entries:
                if kind == LIST:
                    payload = [(stamp if ts == _NEG_INF else ts, v) for ts, v in payload]
                elif kind == MAP:
                    payload = [(mk, stamp if ts == _NEG_INF else ts, v) for mk, ts, v in payload]
                elif payload[0] == _NEG_INF:
                    payload = (stamp, payload[1])
                fixed.append((key_enc, ns_enc, payload))
            dumps[i] = (name, kind, has_ttl, fixed, typing)


def _second(pair: tuple[Any, bytes]) -> bytes:
    return pair[1]


def _typing(descriptor: StateDescriptor) -> Typing:
    if descriptor.value_type is None:
        return None
    return (descriptor.value_type, descriptor.key_type)


def _evolve(name: str, kind: str, old: Typing, new: Typing) -> Callable[[Any], Any] | None:
    """The converter of restored values of ``kind`` state typed ``old`` into ``new`` (None:
    as they are); IncompatibleStateError if they cannot be (``_types.evolution``)."""
    return evolution(
        name, None if old is None else old[0], None if new is None else new[0],
        old_kind=kind, new_kind=kind,
        old_key=None if old is None else old[1], new_key=None if new is None else new[1],
    )  # fmt: skip


def _converted(
    kind: str, entries: list[Entry], convert: Callable[[Any], Any] | None
) -> list[Entry]:
    """``entries`` with every value converted (a typed state's evolution)."""
    if convert is None:
        return entries
    if kind == LIST:
        return [(k, ns, [(ts, convert(v)) for ts, v in data]) for k, ns, data in entries]
    if kind == MAP:
        return [
            (k, ns, [(mk, ts, None if v is None else convert(v)) for mk, ts, v in data])
            for k, ns, data in entries
        ]
    return [(k, ns, (data[0], convert(data[1]))) for k, ns, data in entries]


def check_element(state: str, value: object) -> None:
    if value is None:
        raise StateError(f"state {state!r}: None cannot be stored as a list element")
