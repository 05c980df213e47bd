"""The one container for everything asyncio_ops writes: checkpoint files and state snapshots.

Every checkpoint file (manifest, key groups, operator state, replay log,
function state) and every snapshot blob a state backend hands out is one
container: a header, then sections, each one typed Arrow table::

    header    magic b"AOPSCKP1"            8 bytes
              format version               u16   (4)
              kind                         u16   what the container holds (:class:`Kind`)
              flags                        u16   bit 0: the sections are signed
              sections                     u32   how many follow
    section   tag                          i32   its key group, partition or subtask
              part                         u16   FULL, or DELTA (the keys it names replaced)
              payload length               u64
              raw length                   u64   the payload zstd-decompressed (0: stored raw)
              CRC-32                       u32   of kind, tag, part and payload
              payload                      an Arrow IPC stream of one table, zstd-compressed
                                                 as one frame (if that is smaller)
              HMAC-SHA256                  32 bytes, signed containers only

All integers little-endian. A section verifies on its own (its CRC covers
the container's kind, its tag and part; its signature also the container's
identity), so a reader can fetch just the byte range of the key groups it
needs (Flink's key-group offsets): :func:`encode` returns each section's
offset and length, which the manifest keeps, and ``decode(..., whole=False)``
reads such a range. With a signing key in ``ASYNCIO_OPS_STATE_SIGNING_KEY``
(``asyncio_ops._signing``) every section is signed over the container's
identity (for a checkpoint file: ``<uid>/<version or run>/<name>``, the name
telling its partition), its kind, its tag and part and its bytes; only
sections that verify are parsed, so a section copied into another file,
operator, version, kind or key group, or altered, is refused.

Reading checks everything before a payload is parsed (magic, version, kind,
lengths, CRC, signature), then parses the payload as Arrow and validates it
fully (``validate(full=True)``): loading runs no code and reads no memory
outside its buffers. A container that is torn, truncated, padded, bit-flipped,
of another kind, too new, or written by an earlier release (format versions
1 to 3, and the ``AOSB`` blobs of state snapshots before this format) raises
the caller's corruption error naming ``where``, never a silent loss.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import pyarrow as pa

from ._exceptions import AsyncOpsError
from ._signing import MAC_SIZE, SIGNING_KEY_ENV, mac, signing_key, verifies

__all__ = [
    "DELTA",
    "FORMAT_VERSION",
    "FULL",
    "Kind",
    "Section",
    "decode",
    "encode",
]

MAGIC: Final = b"AOPSCKP1"
FORMAT_VERSION: Final = 4
_EARLIER_BLOB_MAGIC: Final = b"AOSB"  # state snapshots of earlier releases
_HEADER: Final = struct.Struct("<8sHHHI")
_SECTION: Final = struct.Struct("<iHQQI")
_SIGNED: Final = 1
HEADER_SIZE: Final = _HEADER.size
SECTION_HEADER_SIZE: Final = _SECTION.size
FULL: Final = 0
DELTA: Final = 1
_PARTS: Final = (FULL, DELTA)

# One zstd frame per section's whole Arrow stream: its schema, validity bitmaps and
# padding compress too (Arrow's own per-buffer compression leaves those, and a key
# group of a few keys is mostly those: 16 keys, 2.5 KB with it, 0.8 KB this way).
_ZSTD: Final = pa.Codec("zstd") if pa.Codec.is_available("zstd") else None
_MAX_RAW: Final = 1 << 31  # a section's Arrow stream is never this large


class Kind(IntEnum):
    """What a container holds (each kind's table: the module that writes it)."""

    MANIFEST = 1  # one partition's manifest of a version (``_runtime._versions``)
    KEY_GROUPS = 2  # key groups' state and timers, a section each (``state._payloads``)
    OPERATOR_STATE = 3  # one subtask's operator state (``state._payloads``)
    REPLAY_LOG = 4  # completed lookups of a task attempt (``_runtime._replay_log``)
    FUNCTION_STATE = 5  # a function's own state (``_runtime._checkpointing``)
    KEYED_STATE = 6  # one key group's keyed state, without timers (``state._payloads``)


@dataclass(frozen=True)
class Section:
    """One table of a container: its tag (key group, partition), part and table."""

    tag: int
    table: pa.Table
    part: int = FULL


def _ipc(table: pa.Table) -> tuple[bytes, int]:
    """The payload of ``table``'s section and its raw length (0: not compressed)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    raw = sink.getvalue()
    if _ZSTD is not None:
        packed: bytes = _ZSTD.compress(raw, asbytes=True)
        if len(packed) < raw.size:
            return packed, raw.size
    data: bytes = raw.to_pybytes()
    return data, 0


def _crc(kind: int, tag: int, part: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<HiH", kind, tag, part)))


def _signed_parts(identity: str, kind: int, tag: int, part: int) -> bytes:
    return b"%s\x00%d\x00%d\x00%d" % (identity.encode(), kind, tag, part)


def encode(
    kind: Kind, sections: Sequence[Section], identity: str = ""
) -> tuple[bytes, list[tuple[int, int]]]:
    """The container's bytes and each section's ``(offset, length)`` in them (what a
    ranged read of that section fetches: :func:`decode` with ``whole=False``)."""
    key = signing_key()
    out = [_HEADER.pack(MAGIC, FORMAT_VERSION, kind, _SIGNED if key else 0, len(sections))]
    extents = []
    offset = HEADER_SIZE
    for s in sections:
        if s.part not in _PARTS:
            raise ValueError(f"section part {s.part!r} is not FULL or DELTA")
        payload, raw = _ipc(s.table)
        head = _SECTION.pack(s.tag, s.part, len(payload), raw, _crc(kind, s.tag, s.part, payload))
        out += (head, payload)
        length = len(head) + len(payload)
        if key is not None:
            out.append(mac(key, _signed_parts(identity, kind, s.tag, s.part), head, payload))
            length += MAC_SIZE
        extents.append((offset, length))
        offset += length
    return b"".join(out), extents


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
    view = memoryview(data)
    if not whole:
        return _sections(view, 0, kind, signing_key() is not None, where, identity, error)
    if len(view) < HEADER_SIZE:
        if bytes(view[:4]) == _EARLIER_BLOB_MAGIC:
            raise error(_earlier(where, "a snapshot blob of an earlier release"))
        raise error(f"{where} is truncated: {len(view)} bytes, shorter than its header")
    magic, version, got_kind, flags, count = _HEADER.unpack_from(view)
    if magic != MAGIC:
        if bytes(view[:4]) == _EARLIER_BLOB_MAGIC:
            raise error(_earlier(where, "a snapshot blob of an earlier release"))
        raise error(f"{where} is not an asyncio_ops checkpoint or snapshot")
    if version != FORMAT_VERSION:
        if version > FORMAT_VERSION:
            raise error(
                f"{where} has format version {version}, newer than this asyncio_ops reads "
                f"({FORMAT_VERSION}); upgrade asyncio_ops to read it"
            )
        what = "pickle payloads, asyncio_ops 0.1" if version == 1 else "an earlier release"
        raise error(_earlier(where, f"format version {version} ({what})"))
    signed = bool(flags & _SIGNED)
    _check_kind(got_kind, kind, where, error)
    sections = _sections(view, HEADER_SIZE, kind, signed, where, identity, error)
    if len(sections) != count:
        raise error(f"{where} is truncated or torn: {len(sections)} of {count} sections")
    return sections


def _earlier(where: str, what: str) -> str:
    return (
        f"{where} holds {what}: this asyncio_ops reads format version {FORMAT_VERSION} "
        "only (loading older payloads could run code, and one reader keeps one format); "
        "finish the query with the release that wrote it, or start from another "
        "checkpoint location"
    )


def _check_kind(got: int, kind: Kind, where: str, error: type[AsyncOpsError]) -> None:
    if got != kind:
        name = Kind(got).name.lower() if got in Kind._value2member_map_ else str(got)
        raise error(f"{where} holds {name.replace('_', ' ')}, not {kind.name.lower()}")


def _sections(
    view: memoryview,
    pos: int,
    kind: Kind,
    signed: bool,
    where: str,
    identity: str,
    error: type[AsyncOpsError],
) -> list[Section]:
    key = signing_key()
    if signed and key is None:
        raise error(f"{where} is signed; set {SIGNING_KEY_ENV} to the key that signed it")
    if not signed and key is not None:
        raise error(f"{where} is not signed and is not loaded while {SIGNING_KEY_ENV} is set")
    out = []
    while pos < len(view):
        if len(view) - pos < SECTION_HEADER_SIZE:
            raise error(
                f"{where} is padded or torn: {len(view) - pos} bytes after its last section"
            )
        tag, part, length, raw, crc = _SECTION.unpack_from(view, pos)
        head = view[pos : pos + SECTION_HEADER_SIZE]
        start = pos + SECTION_HEADER_SIZE
        payload = view[start : start + length]
        end = start + length + (MAC_SIZE if signed else 0)
        if len(payload) != length or end > len(view):
            raise error(
                f"{where} is truncated or torn: a section of {length} bytes has "
                f"{len(view) - start} left"
            )
        if key is not None and not verifies(
            key, view[start + length : end], _signed_parts(identity, kind, tag, part), head,
            payload,
        ):  # fmt: skip
            raise error(
                f"{where}: its signature does not verify: written with another key, for "
                "another operator, version, partition, key group or kind, or altered; it is "
                "not loaded"
            )
        if _crc(kind, tag, part, payload) != crc:
            raise error(f"{where} fails its checksum (corrupted)")
        if part not in _PARTS:
            raise error(f"{where}: a section of unknown part {part}")
        out.append(Section(tag, _table(payload, raw, where, error), part))
        pos = end
    return out


def _table(payload: memoryview, raw: int, where: str, error: type[AsyncOpsError]) -> pa.Table:
    if raw and _ZSTD is None:
        raise error(f"{where} is zstd-compressed, and this pyarrow lacks zstd")
    if raw > _MAX_RAW:
        raise error(f"{where}: a section claims {raw} bytes uncompressed")
    try:
        stream = pa.py_buffer(payload)
        if _ZSTD is not None and raw:
            stream = _ZSTD.decompress(stream, decompressed_size=raw)
        with pa.ipc.open_stream(stream) as reader:
            table = reader.read_all()
        # Full validation (offsets within their buffers, ...): a crafted stream with a
        # valid checksum must be an error here, never a read outside memory later.
        table.validate(full=True)
        return table
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise error(f"{where} verifies but is not a readable Arrow stream: {exc}") from exc
