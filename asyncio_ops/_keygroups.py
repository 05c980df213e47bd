"""Key groups: how keys map to the unit of state redistribution.

``assign_to_key_group(key, max_parallelism)`` hashes a canonical byte encoding
of the key with MurmurHash3 (x86_32, seed 42) and takes it modulo
``max_parallelism``. Python's ``hash()`` is never used: it differs between
processes (PYTHONHASHSEED), and a key must land in the same group in every
worker and after every restart.

Seed 42 and the encoding of integers (8-byte little-endian two's complement)
are chosen so that, for integer keys, the group equals Spark's
``pmod(hash(col), max_parallelism)`` on a ``LongType`` column; the Spark layer
can then compute the group in the JVM. Strings hash differently from Spark's
``hash()`` (Spark mixes tail bytes its own way), so one operator must use one
hash for all its state and never mix the two.

Operator index and key-group ranges follow Flink's KeyGroupRangeAssignment::

    operator_index(kg)  = kg * parallelism // max_parallelism
    range(index)        = [ceil(index * maxp / p), ceil((index + 1) * maxp / p) - 1]

Keys that are equal in Python get the same encoding: ``True == 1 == 1.0 ==
Decimal(1)`` all encode as the integer 1.
"""

from __future__ import annotations

import datetime as _dt
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Context, Decimal
from typing import Final

import mmh3

from ._exceptions import KeyGroupError, UnsupportedKeyError

DEFAULT_MAX_PARALLELISM: Final = 128
UPPER_BOUND_MAX_PARALLELISM: Final = 1 << 15
HASH_SEED: Final = 42

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_pack_q = struct.Struct("<q").pack
_pack_d = struct.Struct("<d").pack
_pack_len = struct.Struct("<I").pack


def canonical_bytes(key: object) -> bytes:
    """An injective, process-independent byte encoding of ``key``.

    Supported: None, bool, int, float, str, bytes, date, datetime, Decimal and
    tuples of these (nested). Anything else raises :class:`UnsupportedKeyError`
    naming the type.

    Example:

    >>> from asyncio_ops import canonical_bytes
    >>> canonical_bytes(1) == canonical_bytes(True) == canonical_bytes(1.0)  # equal keys
    True
    >>> canonical_bytes(("eu", 7)) == canonical_bytes(("eu", 8))
    False
    """
    t = type(key)
    if t is int or t is bool:
        return _encode_int(int(key))  # type: ignore[call-overload]
    if t is str:
        return b"s" + str.encode(key, "utf-8", "surrogatepass")  # type: ignore[arg-type]
    if key is None:
        return b"n"
    if t is tuple:
        parts = [b"t", _pack_len(len(key))]  # type: ignore[arg-type]
        for item in key:  # type: ignore[attr-defined]
            enc = canonical_bytes(item)
            parts.append(_pack_len(len(enc)))
            parts.append(enc)
        return b"".join(parts)
    if t is bytes:
        return b"b" + key  # type: ignore[operator]
    if t is float:
        f: float = key  # type: ignore[assignment]
        if f.is_integer():
            return _encode_int(int(f))
        return b"f" + _pack_d(f)
    if isinstance(key, Decimal):
        if key.is_finite() and key == key.to_integral_value():
            return _encode_int(int(key))
        as_float = float(key)
        if Decimal(as_float) == key:
            return b"f" + _pack_d(as_float)
        # normalize() under the default context rounds to 28 digits, which would make
        # distinct keys collide: normalise with a precision that keeps every digit.
        exact = Context(prec=max(1, len(key.as_tuple().digits)))
        return b"d" + str(key.normalize(exact)).encode("ascii")
    if isinstance(key, _dt.datetime):
        if key.utcoffset() is not None:
            # Aware datetimes equal in Python (same instant, other zone) must encode
            # alike: normalise to UTC.
            key = key.astimezone(_dt.UTC)
        return b"T" + key.isoformat().encode("ascii")
    if isinstance(key, _dt.date):
        return b"D" + key.isoformat().encode("ascii")
    if isinstance(key, int):  # int subclasses (IntEnum, numpy ints registered as int)
        return _encode_int(int(key))
    if isinstance(key, str):
        return b"s" + str(key).encode("utf-8", "surrogatepass")
    raise UnsupportedKeyError(
        f"key {key!r} has type {t.__module__}.{t.__qualname__}, which has no canonical byte "
        "encoding; use None, bool, int, float, str, bytes, date, datetime, Decimal "
        "or a tuple of these"
    )


def _encode_int(i: int) -> bytes:
    if _INT64_MIN <= i <= _INT64_MAX:
        return b"i" + _pack_q(i)
    raw = i.to_bytes((i.bit_length() + 8) // 8, "little", signed=True)
    return b"I" + raw


def key_hash(key: object) -> int:
    """MurmurHash3 x86_32 (seed 42) of the key: signed 32-bit, like Spark's ``hash()``.

    Integers in int64 range hash their 8 little-endian bytes (Spark-compatible for
    LongType); everything else hashes :func:`canonical_bytes`.
    """
    t = type(key)
    if (t is int or t is bool) and _INT64_MIN <= key <= _INT64_MAX:  # type: ignore[operator]
        return int(mmh3.hash(_pack_q(key), HASH_SEED))
    enc = canonical_bytes(key)
    if enc[0] == 0x69:  # b"i": an integral value given as float/Decimal/int subclass
        return int(mmh3.hash(enc[1:], HASH_SEED))
    return int(mmh3.hash(enc, HASH_SEED))


def assign_to_key_group(key: object, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The key group of ``key``: ``murmur3(key) mod max_parallelism`` (non-negative).

    Example:

    >>> from asyncio_ops.state import assign_to_key_group
    >>> assign_to_key_group("a", 128), assign_to_key_group("b", 128)
    (81, 74)
    """
    return key_hash(key) % max_parallelism


def check_parallelism(max_parallelism: int, parallelism: int | None = None) -> None:
    """Raise :class:`KeyGroupError` unless ``0 < parallelism <= max_parallelism <= 32768``.

    Example:

    >>> from asyncio_ops.state import check_parallelism
    >>> check_parallelism(128, 4)  # fine: nothing happens
    >>> check_parallelism(128, 200)
    Traceback (most recent call last):
    asyncio_ops.KeyGroupError: ...
    """
    if type(max_parallelism) is not int or not (  # True is not 1
        0 < max_parallelism <= UPPER_BOUND_MAX_PARALLELISM
    ):
        raise KeyGroupError(
            f"max_parallelism must be an int in 1..{UPPER_BOUND_MAX_PARALLELISM}, "
            f"got {max_parallelism!r}"
        )
    if parallelism is not None and (
        type(parallelism) is not int or not 0 < parallelism <= max_parallelism
    ):
        raise KeyGroupError(
            f"parallelism must be an int in 1..max_parallelism ({max_parallelism}), "
            f"got {parallelism!r}"
        )


def compute_operator_index_for_key_group(
    max_parallelism: int, parallelism: int, key_group: int
) -> int:
    """The operator instance (0-based) that owns ``key_group``.

    Example:

    >>> from asyncio_ops.state import compute_operator_index_for_key_group
    >>> compute_operator_index_for_key_group(128, 2, 81)  # key "a" at parallelism 2
    1
    """
    check_parallelism(max_parallelism, parallelism)
    if not 0 <= key_group < max_parallelism:
        raise KeyGroupError(f"key_group must be in 0..{max_parallelism - 1}, got {key_group!r}")
    return key_group * parallelism // max_parallelism


def compute_key_group_range_for_operator_index(
    max_parallelism: int, parallelism: int, index: int
) -> KeyGroupRange:
    """The contiguous key groups owned by operator ``index`` (inverse of the above).

    Example:

    >>> from asyncio_ops.state import compute_key_group_range_for_operator_index
    >>> [compute_key_group_range_for_operator_index(128, 2, i) for i in (0, 1)]
    [KeyGroupRange(start=0, end=63), KeyGroupRange(start=64, end=127)]
    """
    check_parallelism(max_parallelism, parallelism)
    if not 0 <= index < parallelism:
        raise KeyGroupError(f"operator index must be in 0..{parallelism - 1}, got {index!r}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism + parallelism - 1) // parallelism - 1
    return KeyGroupRange(start, end)


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """Key groups ``start..end`` inclusive; ``end < start`` is the empty range.

    Example:

    >>> from asyncio_ops.state import KeyGroupRange
    >>> groups = KeyGroupRange(64, 127)
    >>> 81 in groups, len(groups)
    (True, 64)
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0:
            raise KeyGroupError(f"KeyGroupRange start must be >= 0, got {self.start}")

    @classmethod
    def empty(cls) -> KeyGroupRange:
        return cls(0, -1)

    @classmethod
    def of_all(cls, max_parallelism: int) -> KeyGroupRange:
        check_parallelism(max_parallelism)
        return cls(0, max_parallelism - 1)

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __bool__(self) -> bool:
        return self.end >= self.start

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if end >= start else KeyGroupRange.empty()
