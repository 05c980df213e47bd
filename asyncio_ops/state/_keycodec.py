"""Decoding of :func:`asyncio_ops._keygroups.canonical_bytes`, and the key layout.

The RocksDB backend stores keys, namespaces and map keys in their canonical
encoding, and snapshot blobs carry them the same way, so both backends must
be able to turn the bytes back into a value. Decoding yields the canonical
representative of the equality class: ``True``, ``1``, ``1.0`` and
``Decimal(1)`` all come back as ``1``; aware datetimes come back in UTC.

Layout of a RocksDB key (all of one key group share its 2-byte prefix, so a
key-group range is one contiguous range scan)::

    key group (2 bytes, big-endian) | len(key) (4 bytes, big-endian) | key
    | len(namespace) (4 bytes, big-endian) | namespace | suffix

``suffix`` is empty for value, reducing and aggregating state, an 8-byte
sequence number per list element and the encoded map key per map entry.
"""

from __future__ import annotations

import datetime as _dt
import struct
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Final

import mmh3
import numpy as np
import pyarrow as pa

from .._exceptions import CorruptStateError
from .._keygroups import HASH_SEED, canonical_bytes

__all__ = [
    "byte_rows",
    "decode_canonical",
    "encoded_key_group",
    "int_key_column",
    "int_key_rows",
    "key_prefix",
    "namespace_suffix",
]

_unpack_q = struct.Struct("<q").unpack_from
_unpack_d = struct.Struct("<d").unpack_from
_unpack_len = struct.Struct("<I").unpack_from
_pack_be32 = struct.Struct(">I").pack
_pack_be16 = struct.Struct(">H").pack

_I: Final = 0x69  # b"i"


def encoded_key_group(enc: bytes, max_parallelism: int) -> int:
    """The key group of a key given its canonical encoding.

    Equal to ``assign_to_key_group(key, max_parallelism)``: int64 values hash
    their 8 little-endian bytes (the Spark-compatible rule), everything else
    hashes the encoding.
    """
    h = mmh3.hash(enc[1:] if enc[0] == _I else enc, HASH_SEED)
    return int(h) % max_parallelism


def _int64_values(keys: Sequence[Any]) -> np.ndarray | None:
    """The keys as an int64 array; None unless every key is an ``int`` (not a bool or a
    subclass) in the int64 range (beyond it a key is encoded with ``b"I"``, row by row)."""
    if not keys or set(map(type, keys)) != {int}:
        return None
    try:
        return np.fromiter(keys, np.int64, len(keys))
    except OverflowError:
        return None


def int_key_column(keys: list[Any]) -> tuple[list[int], pa.FixedSizeBinaryArray] | None:
    """Integer keys' canonical bytes in their order (``sorted(canonical_bytes(k) for k in
    keys)``), computed as arrays: the positions in ``keys`` in that order, and the bytes
    (``b"i"`` and 8 little-endian bytes each). None unless every key is an ``int`` (not
    a bool or a subclass) in the int64 range, and distinct."""
    values = _int64_values(keys)
    if values is None:
        return None
    # little-endian bytes compared as bytes: the byte-swapped value compared as unsigned
    order = np.argsort(values.byteswap().view(np.uint64), kind="stable")
    ordered = values[order]
    if len(ordered) > 1 and not (ordered[1:] != ordered[:-1]).all():
        return None  # a key twice: not a dict's keys
    rows = np.empty((len(keys), 9), np.uint8)
    rows[:, 0] = _I
    rows[:, 1:] = ordered.astype("<i8").view(np.uint8).reshape(-1, 8)
    column = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(9), len(keys), [None, pa.py_buffer(rows.tobytes())]
    )
    return order.tolist(), column


def int_key_rows(keys: Sequence[Any], key_groups: Sequence[int]) -> np.ndarray | None:
    """``key_prefix(kg, canonical_bytes(k))`` of integer keys and their groups, as the rows
    of a uint8 matrix computed as arrays (15 bytes each: the group, the length 9, ``b"i"``
    and 8 little-endian bytes); None unless every key is an ``int`` (not a bool or a
    subclass) in the int64 range."""
    values = _int64_values(keys)
    if values is None:
        return None
    rows = np.empty((len(keys), 15), np.uint8)
    rows[:, 0:2] = np.asarray(key_groups, ">u2").view(np.uint8).reshape(-1, 2)
    rows[:, 2:6] = np.frombuffer(_pack_be32(9), np.uint8)
    rows[:, 6] = _I
    rows[:, 7:] = values.astype("<i8").view(np.uint8).reshape(-1, 8)
    return rows


def byte_rows(rows: np.ndarray) -> list[bytes]:
    """The rows of a uint8 matrix as bytes objects (one C pass)."""
    n, width = rows.shape
    if not width:
        return [b""] * n
    out: list[bytes] = np.ascontiguousarray(rows).view(f"V{width}").ravel().tolist()
    return out


def key_prefix(key_group: int, enc: bytes) -> bytes:
    """``key group | len(key) | key`` for a RocksDB key."""
    return _pack_be16(key_group) + _pack_be32(len(enc)) + enc


def namespace_suffix(namespace: object) -> bytes:
    """``len(namespace) | namespace`` for a RocksDB key."""
    enc = canonical_bytes(namespace)
    return _pack_be32(len(enc)) + enc


def decode_canonical(data: bytes | memoryview) -> Any:
    """The value whose :func:`canonical_bytes` is ``data``; CorruptStateError if none.

    Example:

    >>> from asyncio_ops import canonical_bytes, decode_canonical
    >>> decode_canonical(canonical_bytes(("user", 7)))
    ('user', 7)
    >>> decode_canonical(b"?")
    Traceback (most recent call last):
    ...
    asyncio_ops.CorruptStateError: undecodable canonical key bytes b'?'
    """
    buf = bytes(data)
    try:
        value, end = _decode(buf, 0, len(buf))
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptStateError(f"undecodable canonical key bytes {buf[:32]!r}") from exc
    if end != len(buf):
        raise CorruptStateError(f"trailing bytes after canonical key {buf[:32]!r}")
    return value


def _decode(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
    tag = buf[pos]
    pos += 1
    if tag == _I:
        if end - pos != 8:
            raise ValueError("int64 needs 8 bytes")
        return _unpack_q(buf, pos)[0], end
    if tag == 0x73:  # s
        return buf[pos:end].decode("utf-8", "surrogatepass"), end
    if tag == 0x6E:  # n
        if pos != end:
            raise ValueError("None takes no bytes")
        return None, end
    if tag == 0x74:  # t
        (count,) = _unpack_len(buf, pos)
        pos += 4
        items = []
        for _ in range(count):
            (n,) = _unpack_len(buf, pos)
            pos += 4
            if pos + n > end:
                raise ValueError("tuple item runs past the end")
            item, _stop = _decode(buf, pos, pos + n)
            items.append(item)
            pos += n
        if pos != end:
            raise ValueError("tuple length mismatch")
        return tuple(items), end
    if tag == 0x62:  # b
        return buf[pos:end], end
    if tag == 0x66:  # f
        if end - pos != 8:
            raise ValueError("float needs 8 bytes")
        return _unpack_d(buf, pos)[0], end
    if tag == 0x49:  # I: big int
        return int.from_bytes(buf[pos:end], "little", signed=True), end
    if tag == 0x64:  # d
        return Decimal(buf[pos:end].decode("ascii")), end
    if tag == 0x54:  # T
        return _dt.datetime.fromisoformat(buf[pos:end].decode("ascii")), end
    if tag == 0x44:  # D
        return _dt.date.fromisoformat(buf[pos:end].decode("ascii")), end
    raise ValueError(f"unknown tag {tag:#x}")
