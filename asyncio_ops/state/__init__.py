"""The state layer of asyncio_ops: key groups, keyed and operator state, TTL, timers.

Engine independent (no pyspark). See ``docs/state.md`` for the model, the TTL
decisions, the snapshot blob format and rescaling.

Keyed state lives in a backend (:class:`HeapKeyedStateBackend` or
:class:`RocksDBKeyedStateBackend`) that owns a range of key groups; states are
obtained from descriptors and read and write the backend's current key::

    backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    seen = backend.get_state(ValueStateDescriptor("seen", ttl=StateTtlConfig(3600)))
    backend.set_current_key("user-1")
    seen.update(True)

:class:`KeyedProcessOperator` runs a :class:`KeyedProcessFunction` with keyed
state and timers over ``Record``/``Watermark`` input. It is an operator, defined
beside ``AsyncWaitOperator`` (``asyncio_ops._keyed_operator``) on the state layer,
and exported here with the function a user subclasses.
"""

from .._exceptions import (
    ConfigurationError,
    CorruptStateError,
    KeyGroupError,
    StateError,
    UnsupportedKeyError,
)
from .._keyed_operator import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedProcessOperator,
    KeyedRuntimeContext,
    TimeDomain,
    TimerService,
)
from .._keygroups import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupRange,
    assign_to_key_group,
    canonical_bytes,
    check_parallelism,
    compute_key_group_range_for_operator_index,
    compute_operator_index_for_key_group,
)
from ._api import (
    AggregateFunction,
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    State,
    ValueState,
)
from ._backend import KeyedStateBackend
from ._descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from ._heap import HeapKeyedStateBackend
from ._keycodec import decode_canonical
from ._keyed_snapshot import restore_key_groups, snapshot_key_groups
from ._operator_state import OperatorStateBackend
from ._rocksdb import RocksDBKeyedStateBackend, RocksDBSnapshot
from ._serializers import PICKLE_SERIALIZER, PickleSerializer, Serializer
from ._ttl import (
    StateTtlConfig,
    StateVisibility,
    TtlTimeCharacteristic,
    UpdateType,
    cleanup_full_snapshot,
    cleanup_in_rocksdb_compaction,
    cleanup_incrementally,
)

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "PICKLE_SERIALIZER",
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "Collector",
    "ConfigurationError",
    "CorruptStateError",
    "HeapKeyedStateBackend",
    "KeyGroupError",
    "KeyGroupRange",
    "KeyedProcessContext",
    "KeyedProcessFunction",
    "KeyedProcessOperator",
    "KeyedRuntimeContext",
    "KeyedStateBackend",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "OperatorStateBackend",
    "PickleSerializer",
    "ReducingState",
    "ReducingStateDescriptor",
    "RocksDBKeyedStateBackend",
    "RocksDBSnapshot",
    "Serializer",
    "State",
    "StateDescriptor",
    "StateError",
    "StateTtlConfig",
    "StateVisibility",
    "TimeDomain",
    "TimerService",
    "TtlTimeCharacteristic",
    "UnsupportedKeyError",
    "UpdateType",
    "ValueState",
    "ValueStateDescriptor",
    "assign_to_key_group",
    "canonical_bytes",
    "check_parallelism",
    "cleanup_full_snapshot",
    "cleanup_in_rocksdb_compaction",
    "cleanup_incrementally",
    "compute_key_group_range_for_operator_index",
    "compute_operator_index_for_key_group",
    "decode_canonical",
    "restore_key_groups",
    "snapshot_key_groups",
]
