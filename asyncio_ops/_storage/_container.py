"""The one container for everything asyncio_ops writes: checkpoint files and state snapshots.

Every checkpoint file (manifest, key groups, operator state, replay log,
function state) and every snapshot blob a state backend hands out is one
container: a header, then frames of sections, each section one typed Arrow
table::

    header    magic b"AOPSCKP1"            8 bytes
              format version               u16   (7; 4 to 6 are read too)
              kind                         u16   what the container holds (:class:`Kind`)
              flags                        u16   bit 0: the frames are signed
              frames                       u32
              sections                     u32   in all frames
    frame     sections                     u32   in this frame
              stored length                u64
              raw length                   u64   the stored bytes zstd-decompressed
                                                 (0: stored raw)
              CRC-32                       u32   of kind, sections, raw length, stored bytes
              stored bytes                 the frame's sections back to back, compressed
                                                 as one zstd frame (if that is smaller)
              HMAC-SHA256                  32 bytes, signed containers only
    section   tag                          i32   its key group, partition or subtask;
                                                 SHARED (-1): several key groups',
                                                 each row's in a ``key_group`` column
              part                         u16   FULL, or DELTA (the keys it names replaced:
                                                 since version 5 a key with entries or
                                                 timers in it is named by those alone)
              length                       u64
              table                        an Arrow IPC stream of one table (since
                                                 version 6 some columns packed: a field
                                                 marked aops.packed is dictionary-encoded
                                                 or fixed-size binary, since version 7
                                                 its bytes split into streams; read
                                                 back plain)

All integers little-endian. Sections go into one frame until it holds about
4 MiB (a section larger than that is a frame of its own): sections compress
together, as a whole file would (a zstd frame per key group was 3.2x larger
for 128 key groups of 156 keys; 4 MiB frames are within 1.35x of one frame
for a whole 40 MB file), and
a frame verifies on its own (its CRC covers the container's kind; its
signature also the container's identity), so a reader can fetch just the
frames holding the key groups it needs (Flink's key-group offsets):
:func:`encode` returns each section's frame as ``(offset, length)``, which the
manifest keeps, and ``decode(..., whole=False)`` reads such a range. With a
signing key in ``ASYNCIO_OPS_STATE_SIGNING_KEY`` (``asyncio_ops._storage._signing``)
every frame is signed over the container's identity (for a checkpoint file:
``<uid>/<version or run>/<name>``, the name telling its partition), its kind
and its bytes (the sections' tags and parts inside): only frames that verify
are parsed, so a frame copied into another file, operator, version or kind,
or altered, is refused.

Reading checks everything before a table is parsed (magic, version, kind,
lengths, CRC, signature), then parses each table as Arrow and validates it
fully (``validate(full=True)``): loading runs no code and reads no memory
outside its buffers. A container that is torn, truncated, padded, bit-flipped,
of another kind, too new, or written by an earlier release (format versions
1 to 3, and the ``AOSB`` blobs of state snapshots before this format) raises
the caller's corruption error naming ``where``, never a silent loss.
:func:`decode` does both; :func:`frames` makes the checks alone, and
:func:`frame_sections` parses one checked frame, for a reader that holds one
frame's tables at a time (a restore applying each as it goes).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._exceptions import AsyncOpsError
from ._signing import MAC_SIZE, SIGNING_KEY_ENV, mac, signing_key, verifies

__all__ = [
    "DELTA",
    "FORMAT_VERSION",
    "FULL",
    "KEY_GROUP_FIELD",
    "SHARED",
    "Frame",
    "Kind",
    "Section",
    "decode",
    "encode",
    "frame_sections",
    "frames",
    "split_shared",
]

MAGIC: Final = b"AOPSCKP1"
FORMAT_VERSION: Final = 7
# Version 5 differs only in storing every column plain (6 packs some, :func:`_pack`), and
# version 4 also in its deltas naming every key they replace in a row of its own, which
# the reader of later deltas also reads right: all three are read.
_READS: Final = frozenset({4, 5, 6, FORMAT_VERSION})
_EARLIER_BLOB_MAGIC: Final = b"AOSB"  # state snapshots of earlier releases
_HEADER: Final = struct.Struct("<8sHHHII")
_FRAME: Final = struct.Struct("<IQQI")
_SECTION: Final = struct.Struct("<iHQ")
_SIGNED: Final = 1
HEADER_SIZE: Final = _HEADER.size
FRAME_HEADER_SIZE: Final = _FRAME.size
_FRAME_BYTES: Final = 4 << 20  # a frame closes once its sections hold this much
FULL: Final = 0
DELTA: Final = 1
SHARED: Final = -1
"""The tag of a section holding several key groups: each row's in the int32 column
:data:`KEY_GROUP_FIELD` (see ``_runtime._versions``); keyed state's deltas sorted by it
(:func:`split_shared` slices them), carried-over elements in queue order."""
KEY_GROUP_FIELD: Final = "key_group"
_PARTS: Final = (FULL, DELTA)

# One zstd frame per frame's sections, Arrow streams whole: schemas, validity bitmaps
# and padding compress too (Arrow's own per-buffer compression leaves those, and a key
# group of a few keys is mostly those: 16 keys, 2.5 KB with it, 0.8 KB this way).
# Level 3 (zstd's own default): on a million keys' state 3.4x smaller than level 1 at the
# same speed, since its window reaches across key groups.
_ZSTD: Final = pa.Codec("zstd", compression_level=3) if pa.Codec.is_available("zstd") else None
# ``encode(..., thorough=True)`` (keyed_process's key-group files and manifests: a small
# micro-batch's deltas and chains, written every version and kept for many): a frame of
# less than _SMALL_FRAME bytes at level 19, 6% to 20% smaller than at level 3 (a
# manifest 1,355 -> 1,221 bytes, a delta of 63 KB 3,510 -> 3,167) for a few
# milliseconds (3.3 ms for 63 KB; 0.4 ms for a manifest of 2.7 KB, where a carry-over of
# 2,000 elements, written and read once, takes 3 ms to write: it is not thorough); a
# larger frame at level 3, where level 19 would cost seconds per hundred megabytes.
_ZSTD_SMALL: Final = (
    pa.Codec("zstd", compression_level=19) if pa.Codec.is_available("zstd") else None
)
_SMALL_FRAME: Final = 128 << 10
_MAX_RAW: Final = 1 << 31  # a section's Arrow stream is never this large


class Kind(IntEnum):
    """What a container holds (each kind's table: the module that writes it)."""

    MANIFEST = 1  # one partition's manifest of a version (``_runtime._versions``)
    KEY_GROUPS = 2  # key groups' state and timers: a section each, or SHARED (deltas)
    OPERATOR_STATE = 3  # one subtask's operator state (``state._payloads``)
    REPLAY_LOG = 4  # completed lookups of a task attempt (``_runtime._replay_log``)
    FUNCTION_STATE = 5  # a function's own state (``_runtime._partition_checkpoint``)
    KEYED_STATE = 6  # one key group's keyed state, without timers (``state._payloads``)
    IN_FLIGHT = 7  # a partition's carried-over elements, a SHARED section (``_runtime._inflight``)


@dataclass(frozen=True)
class Section:
    """One table of a container: its tag (key group, partition), part and table."""

    tag: int
    table: pa.Table
    part: int = FULL


def _ipc(table: pa.Table) -> pa.Buffer:
    table = _pack(table)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


# Packed columns (since format 6): a string or binary column whose values repeat (a state's name
# and kind on every row, one namespace) is stored dictionary-encoded, and a binary column
# whose values all have one length (integer keys, small pickled counts) as fixed-size
# binary: no offsets, which zstd cannot shrink (an arithmetic run of int32s per row), and
# which were most of a key group's bytes (a full key group of 7,800 running counts: 80 KB
# as plain columns, 16 KB packed); a list of strings (format 6 manifests' file names per
# key group; a typed state's lists of strings) has its strings dictionary-encoded. The
# field says how (``_PACKED``); a reader gets the column back as written. Columns of
# other types are stored as they are.
# Since format 7 a fixed-size column's bytes are stored split into streams, the first
# byte of every value, then the second, ... (Parquet's BYTE_STREAM_SPLIT): an integer key
# ``b"i" + 8 bytes little-endian`` is six constant bytes and two or three that vary, which
# zstd stores in about a byte each once they stand apart and in 3 to 4 interleaved (one
# full copy of 1,000,000 running counts 24% smaller: docs/state.md).
_PACKED: Final = b"aops.packed"
_DICTIONARY: Final = b"dictionary"
_FIXED: Final = b"fixed"  # format 6: fixed-size binary, bytes as they are
_SPLIT: Final = b"fixed-split"  # format 7: fixed-size binary, bytes split into streams
_DICTIONARY_LIST: Final = b"list-dictionary"
_PLAIN: Final = (pa.string(), pa.binary())
_SAMPLE: Final = 4096  # values a column's first look at its repeats takes


def _plain_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) and t.value_type in _PLAIN


def _pack(table: pa.Table) -> pa.Table:
    """``table`` with its packable columns packed (see above)."""
    if table.num_rows < 2 or not any(f.type in _PLAIN or _plain_list(f.type) for f in table.schema):
        return table
    fields: list[pa.Field] = []
    columns: list[pa.ChunkedArray | pa.Array] = []
    for field, column in zip(table.schema, table.columns, strict=True):
        how = None
        if _plain_list(field.type):  # lists of strings: the child dictionary-encoded
            whole = column.combine_chunks()
            values = whole.values.dictionary_encode()
            if 2 * len(values.dictionary) <= len(values):
                item = field.type.value_field.with_type(values.type)
                how, column = (
                    _DICTIONARY_LIST,
                    pa.ListArray.from_arrays(
                        whole.offsets, values, type=pa.list_(item), mask=whole.is_null()
                    ),
                )
        elif field.type in _PLAIN and column.null_count < len(column):
            whole = column.combine_chunks()
            sample = whole.slice(0, _SAMPLE)  # mostly distinct there: not worth encoding all
            if 2 * len(sample.unique()) <= len(sample) or len(whole) <= _SAMPLE:
                packed = whole.dictionary_encode()
                if 2 * len(packed.dictionary) <= len(whole):
                    how, column = _DICTIONARY, packed
            if how is None and field.type == pa.binary():
                low, high = pc.min_max(pc.binary_length(whole)).values()
                if low.as_py() == high.as_py() and low.as_py():
                    how, column = _SPLIT, _streams(whole.cast(pa.binary(low.as_py())), True)
        if how is not None:
            field = pa.field(field.name, column.type, field.nullable,
                             {**(field.metadata or {}), _PACKED: how})  # fmt: skip
        fields.append(field)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, table.schema.metadata))


def _streams(column: pa.FixedSizeBinaryArray, split: bool) -> pa.FixedSizeBinaryArray:
    """``column``'s bytes split into streams (``split``), or joined back: its values as
    a ``rows x width`` matrix of bytes, transposed (joined: the stored bytes read as
    ``width x rows``). Nulls keep their place (their bytes are transposed too)."""
    width, rows = column.type.byte_width, len(column)
    start = column.offset * width
    data = np.frombuffer(column.buffers()[1], np.uint8)[start : start + rows * width]
    matrix = data.reshape(rows, width) if split else data.reshape(width, rows)
    validity = column.is_valid().buffers()[1] if column.null_count else None
    return pa.FixedSizeBinaryArray.from_buffers(
        column.type, rows, [validity, pa.py_buffer(matrix.T.tobytes())], column.null_count
    )


def _unpack(table: pa.Table) -> pa.Table:
    """``table`` with its packed columns as they were written (:func:`_pack`)."""
    packed = [i for i, f in enumerate(table.schema) if f.metadata and _PACKED in f.metadata]
    if not packed:
        return table
    for i in packed:
        field = table.schema.field(i)
        meta = {k: v for k, v in field.metadata.items() if k != _PACKED}
        how = field.metadata[_PACKED]
        column = table.column(i)
        if (
            how == _DICTIONARY
            and pa.types.is_dictionary(field.type)
            and (field.type.value_type in _PLAIN)
        ):
            column, kind = column.cast(field.type.value_type), field.type.value_type
        elif how in (_FIXED, _SPLIT) and pa.types.is_fixed_size_binary(field.type):
            if how == _SPLIT:
                column = _streams(column.combine_chunks(), False)
            column, kind = column.cast(pa.binary()), pa.binary()
        elif (
            how == _DICTIONARY_LIST
            and pa.types.is_list(field.type)
            and (
                pa.types.is_dictionary(field.type.value_type)
                and field.type.value_type.value_type in _PLAIN
            )
        ):
            item = field.type.value_field
            kind = pa.list_(item.with_type(item.type.value_type))
            column = column.cast(kind)
        else:
            raise ValueError(f"column {field.name!r} is {field.type}, marked packed as {how!r}")
        plain = pa.field(field.name, kind, field.nullable, meta or None)
        table = table.set_column(i, plain, column)
    return table


def _crc(kind: int, count: int, raw: int, stored: bytes | memoryview) -> int:
    return zlib.crc32(stored, zlib.crc32(struct.pack("<HIQ", kind, count, raw)))


def _signed(identity: str, kind: int) -> bytes:
    return b"%s\x00%d" % (identity.encode(), kind)


def encode(
    kind: Kind, sections: Iterable[Section], identity: str = "", thorough: bool = False
) -> tuple[bytes, list[tuple[int, int, int]]]:
    """The container's bytes and, per section, the ``(offset, length)`` of its frame
    (what a ranged read of that section fetches: :func:`decode` with ``whole=False``)
    and the section's own size (its Arrow stream's bytes, uncompressed).

    ``sections`` is taken one at a time and each frame is compressed as soon as it
    closes: the encoder holds one frame's Arrow streams and the bytes stored so far,
    never every section's table, so a generator that builds each section when asked
    (a key group's full state) keeps one in memory at a time. ``thorough``: a small
    frame at zstd level 19 (see ``_ZSTD_SMALL``)."""
    key = signing_key()
    flags = _SIGNED if key else 0
    out: list[bytes] = []
    extents: list[tuple[int, int, int]] = []
    offset = HEADER_SIZE
    parts: list[bytes | pa.Buffer] = []
    sizes: list[int] = []
    frames = 0

    def close() -> None:
        nonlocal offset, frames
        count = len(parts) // 2
        raw_bytes = b"".join(parts)
        parts.clear()
        stored, raw = raw_bytes, 0
        codec = _ZSTD_SMALL if thorough and len(raw_bytes) < _SMALL_FRAME else _ZSTD
        if codec is not None:
            packed: bytes = codec.compress(raw_bytes, asbytes=True)
            if len(packed) < len(raw_bytes):
                stored, raw = packed, len(raw_bytes)
        head = _FRAME.pack(count, len(stored), raw, _crc(kind, count, raw, stored))
        out.extend((head, stored))
        length = len(head) + len(stored)
        if key is not None:
            out.append(mac(key, _signed(identity, kind), head, stored))
            length += MAC_SIZE
        extents.extend((offset, length, size) for size in sizes[-count:])
        offset += length
        frames += 1

    size = 0
    for s in sections:
        if s.part not in _PARTS:
            raise ValueError(f"section part {s.part!r} is not FULL or DELTA")
        if size >= _FRAME_BYTES:
            close()
            size = 0
        body = _ipc(s.table)
        parts += (_SECTION.pack(s.tag, s.part, body.size), body)
        size += _SECTION.size + body.size
        sizes.append(body.size)
    if parts:
        close()
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, kind, flags, frames, len(sizes))
    return b"".join([header, *out]), extents


def decode(
    data: bytes | bytearray | memoryview,
    kind: Kind,
    where: str,
    identity: str = "",
    error: type[AsyncOpsError] = AsyncOpsError,
    *,
    whole: bool = True,
) -> list[Section]:
    """Every section of a whole container of ``kind``, verified; ``error`` (naming
    ``where``) for anything else.

    ``whole=False``: ``data`` is a byte range of such a container that covers whole
    sections back to back (offsets and lengths from :func:`encode`), each verified on
    its own; a signing key in the environment decides whether they must be signed.
    """
    return [
        s
        for f in frames(data, kind, where, identity, error, whole=whole)
        for s in frame_sections(f, where, error)
    ]


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a container, its checksum (and signature) verified, its sections
    not yet parsed (:func:`frame_sections`)."""

    count: int
    stored: memoryview
    raw: int


def frames(
    data: bytes | bytearray | memoryview,
    kind: Kind,
    where: str,
    identity: str = "",
    error: type[AsyncOpsError] = AsyncOpsError,
    *,
    whole: bool = True,
) -> list[Frame]:
    """The frames of a container of ``kind`` (``whole``: all of it, checked against its
    header; else a byte range of whole frames, as :func:`decode` reads), each checked
    (length, checksum, signature) but not inflated or parsed: a reader that takes them
    one at a time holds one frame's tables, not the container's."""
    view = memoryview(data)
    if not whole:
        return _frames(view, 0, kind, signing_key() is not None, where, identity, error)
    if len(view) < HEADER_SIZE:
        if bytes(view[:4]) == _EARLIER_BLOB_MAGIC:
            raise error(_earlier(where, "a snapshot blob of an earlier release"))
        raise error(f"{where} is truncated: {len(view)} bytes, shorter than its header")
    magic, version, got_kind, flags, count_frames, count = _HEADER.unpack_from(view)
    if magic != MAGIC:
        if bytes(view[:4]) == _EARLIER_BLOB_MAGIC:
            raise error(_earlier(where, "a snapshot blob of an earlier release"))
        raise error(f"{where} is not an asyncio_ops checkpoint or snapshot")
    if version not in _READS:
        if version > FORMAT_VERSION:
            raise error(
                f"{where} has format version {version}, newer than this asyncio_ops reads "
                f"({FORMAT_VERSION}); upgrade asyncio_ops to read it"
            )
        what = "pickle payloads, asyncio_ops 0.1" if version == 1 else "an earlier release"
        raise error(_earlier(where, f"format version {version} ({what})"))
    signed = bool(flags & _SIGNED)
    _check_kind(got_kind, kind, where, error)
    got = _frames(view, HEADER_SIZE, kind, signed, where, identity, error)
    sections = sum(f.count for f in got)
    if len(got) != count_frames or sections != count:
        raise error(
            f"{where} is truncated or torn: {len(got)} of {count_frames} frames, {sections} "
            f"of {count} sections"
        )
    return got


def frame_sections(
    frame: Frame, where: str, error: type[AsyncOpsError] = AsyncOpsError
) -> list[Section]:
    """The sections of a verified frame (:func:`frames`), inflated and parsed."""
    return _unframe(_inflate(frame.stored, frame.raw, where, error), frame.count, where, error)


def split_shared(
    section: Section, where: str, error: type[AsyncOpsError] = AsyncOpsError
) -> list[Section]:
    """The key groups of a SHARED section, a section each, of its part (the rows of its
    key group, without the key-group column; zero-copy slices). ``error`` naming
    ``where`` if it has no int32 key-group column or is not sorted by it."""
    table = section.table
    index = table.schema.get_field_index(KEY_GROUP_FIELD)
    if index < 0 or table.schema.field(index).type != pa.int32():
        raise error(
            f"{where}: a section of several key groups without an int32 "
            f"{KEY_GROUP_FIELD!r} column ({table.schema.names})"
        )
    column = table.column(index)
    rest = table.remove_column(index)
    if column.null_count:
        raise error(f"{where}: a row without its key group")
    runs = pc.run_end_encode(column.combine_chunks())
    groups = runs.values.to_pylist()
    if groups != sorted(set(groups)):
        raise error(f"{where}: a section of several key groups not sorted by key group")
    out: list[Section] = []
    start = 0
    for kg, end in zip(groups, runs.run_ends.to_pylist(), strict=True):
        out.append(Section(kg, rest.slice(start, end - start), section.part))
        start = end
    return out


def _earlier(where: str, what: str) -> str:
    return (
        f"{where} holds {what}: this asyncio_ops reads format versions 4 to "
        f"{FORMAT_VERSION} only (loading older payloads could run code, and one reader "
        "keeps one format); "
        "finish the query with the release that wrote it, or start from another "
        "checkpoint location"
    )


def _check_kind(got: int, kind: Kind, where: str, error: type[AsyncOpsError]) -> None:
    if got != kind:
        name = Kind(got).name.lower() if got in Kind._value2member_map_ else str(got)
        raise error(f"{where} holds {name.replace('_', ' ')}, not {kind.name.lower()}")


def _frames(
    view: memoryview,
    pos: int,
    kind: Kind,
    signed: bool,
    where: str,
    identity: str,
    error: type[AsyncOpsError],
) -> list[Frame]:
    """The frames from ``pos`` to the end of ``view``, each checked."""
    key = signing_key()
    if signed and key is None:
        raise error(f"{where} is signed; set {SIGNING_KEY_ENV} to the key that signed it")
    if not signed and key is not None:
        raise error(f"{where} is not signed and is not loaded while {SIGNING_KEY_ENV} is set")
    out: list[Frame] = []
    while pos < len(view):
        if len(view) - pos < FRAME_HEADER_SIZE:
            raise error(f"{where} is padded or torn: {len(view) - pos} bytes after its last frame")
        count, length, raw, crc = _FRAME.unpack_from(view, pos)
        head = view[pos : pos + FRAME_HEADER_SIZE]
        start = pos + FRAME_HEADER_SIZE
        stored = view[start : start + length]
        end = start + length + (MAC_SIZE if signed else 0)
        if len(stored) != length or end > len(view):
            raise error(
                f"{where} is truncated or torn: a frame of {length} bytes has "
                f"{len(view) - start} left"
            )
        if key is not None and not verifies(
            key, view[start + length : end], _signed(identity, kind), head, stored
        ):
            raise error(
                f"{where}: its signature does not verify: written with another key, for "
                "another operator, version, partition or kind, or altered; it is not loaded"
            )
        if _crc(kind, count, raw, stored) != crc:
            raise error(f"{where} fails its checksum (corrupted)")
        out.append(Frame(count, stored, raw))
        pos = end
    return out


def _inflate(stored: memoryview, raw: int, where: str, error: type[AsyncOpsError]) -> memoryview:
    if not raw:
        return stored
    if _ZSTD is None:
        raise error(f"{where} is zstd-compressed, and this pyarrow lacks zstd")
    if raw > _MAX_RAW:
        raise error(f"{where}: a frame claims {raw} bytes uncompressed")
    try:
        return memoryview(_ZSTD.decompress(stored, decompressed_size=raw))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise error(f"{where} verifies but does not decompress: {exc}") from exc


def _unframe(data: memoryview, count: int, where: str, error: type[AsyncOpsError]) -> list[Section]:
    out = []
    pos = 0
    for _ in range(count):
        if len(data) - pos < _SECTION.size:
            raise error(f"{where}: a frame ends inside a section header")
        tag, part, length = _SECTION.unpack_from(data, pos)
        start = pos + _SECTION.size
        if part not in _PARTS or start + length > len(data):
            raise error(f"{where}: a frame holds a malformed section")
        out.append(Section(tag, _table(data[start : start + length], where, error), part))
        pos = start + length
    if pos != len(data):
        raise error(f"{where}: a frame holds {len(data) - pos} bytes after its sections")
    return out


def _table(payload: memoryview, where: str, error: type[AsyncOpsError]) -> pa.Table:
    try:
        with pa.ipc.open_stream(pa.py_buffer(payload)) as reader:
            table = reader.read_all()
        # Full validation (offsets within their buffers, ...): a crafted stream with a
        # valid checksum must be an error here, never a read outside memory later.
        table.validate(full=True)
        return _unpack(table)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise error(f"{where} verifies but is not a readable Arrow stream: {exc}") from exc
