"""The sealed blob: how one key group's snapshot travels.

Every snapshot blob (keyed state, keyed operator, operator state) is::

    magic  b"AOSB"               4 bytes
    format version               1 byte   (3 unsigned, 4 signed)
    blob kind                    1 byte   (KEYED_STATE, KEYED_OPERATOR, OPERATOR_STATE)
    key group                    2 bytes  big-endian (0 for operator state)
    payload length               4 bytes  big-endian
    CRC-32 of the payload        4 bytes  big-endian
    payload                      one Arrow IPC table, typed per kind (see ``_payloads``)
    HMAC-SHA256                  32 bytes, version 4 only: of everything before it

:func:`unseal` checks all of it and raises :class:`CorruptStateError` naming
the key group (and what is wrong) for a blob that is truncated, altered, of
another kind or version, filed under another key group, or whose payload is
not the typed table of its kind.

Loading a blob runs no code: the payload is parsed as Arrow and validated,
never unpickled. Versions 1 and 2 (pickle payloads, asyncio_ops 0.1) are
refused by name. User values inside are the bytes of their state
descriptor's serializer; the default serializer is pickle, so a restored
state's values are loaded by pickle when the state reads them: that is the
trust boundary (docs/state.md). With a signing key in the environment
(:data:`SIGNING_KEY_ENV`), every blob written is signed, and only blobs whose
signature verifies are read at all: an unsigned blob, a blob signed with
another key, or an altered one is refused before its payload is parsed.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from typing import Any, Final

from .._exceptions import CorruptStateError
from .._signing import MAC_SIZE, SIGNING_KEY_ENV, signing_key
from . import _payloads

__all__ = [
    "FORMAT_VERSION",
    "KEYED_OPERATOR",
    "KEYED_STATE",
    "OPERATOR_STATE",
    "SIGNED_FORMAT_VERSION",
    "SIGNING_KEY_ENV",
    "seal",
    "unseal",
]

MAGIC: Final = b"AOSB"
FORMAT_VERSION: Final = 3
SIGNED_FORMAT_VERSION: Final = 4
_PICKLE_VERSIONS: Final = (1, 2)
_MAC_SIZE: Final = MAC_SIZE
KEYED_STATE: Final = 1
KEYED_OPERATOR: Final = 2
OPERATOR_STATE: Final = 3
_KIND_NAMES: Final = {
    KEYED_STATE: "keyed state",
    KEYED_OPERATOR: "keyed operator",
    OPERATOR_STATE: "operator state",
}

_HEADER: Final = struct.Struct(">4sBBHII")
HEADER_SIZE: Final = _HEADER.size


def _mac(key: bytes, data: bytes | memoryview) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def seal(kind: int, key_group: int, payload: Any) -> bytes:
    """Encode ``payload`` (typed, see ``_payloads``) in a verified header (signed if a
    key is set)."""
    body = _payloads.encode(_KIND_NAMES[kind], payload)
    key = signing_key()
    version = FORMAT_VERSION if key is None else SIGNED_FORMAT_VERSION
    blob = _HEADER.pack(MAGIC, version, kind, key_group, len(body), zlib.crc32(body)) + body
    return blob if key is None else blob + _mac(key, blob)


def unseal(kind: int, key_group: int, blob: object, *, what: str = "key group") -> Any:
    """Verify ``blob`` and return its payload; CorruptStateError naming ``key_group``."""
    where = f"{what} {key_group}"
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise CorruptStateError(f"{where}: snapshot blob must be bytes, got {type(blob).__name__}")
    view = memoryview(blob)
    if len(view) < HEADER_SIZE:
        raise CorruptStateError(
            f"{where}: snapshot blob truncated ({len(view)} bytes, header needs {HEADER_SIZE})"
        )
    magic, version, blob_kind, blob_kg, length, crc = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise CorruptStateError(f"{where}: not an asyncio_ops snapshot blob (magic {magic!r})")
    if version in _PICKLE_VERSIONS:
        raise CorruptStateError(
            f"{where}: snapshot format version {version} holds a pickle (asyncio_ops 0.1) "
            "and is not loaded: loading it could run code; restore from a newer snapshot"
        )
    if version not in (FORMAT_VERSION, SIGNED_FORMAT_VERSION):
        raise CorruptStateError(
            f"{where}: snapshot format version {version} is not supported "
            f"(this build reads versions {FORMAT_VERSION} and {SIGNED_FORMAT_VERSION})"
        )
    key = signing_key()
    if version == SIGNED_FORMAT_VERSION:
        if key is None:
            raise CorruptStateError(
                f"{where}: the blob is signed; set {SIGNING_KEY_ENV} to the key that signed it"
            )
        if len(view) < HEADER_SIZE + _MAC_SIZE or not hmac.compare_digest(
            view[-_MAC_SIZE:], _mac(key, view[:-_MAC_SIZE])
        ):
            raise CorruptStateError(
                f"{where}: the blob's signature does not verify (another key, or altered); "
                "it is not loaded"
            )
        view = view[:-_MAC_SIZE]
    elif key is not None:
        raise CorruptStateError(
            f"{where}: an unsigned blob is not loaded while {SIGNING_KEY_ENV} is set"
        )
    if blob_kind != kind:
        raise CorruptStateError(
            f"{where}: expected a {_KIND_NAMES.get(kind, kind)} blob, got "
            f"{_KIND_NAMES.get(blob_kind, blob_kind)}"
        )
    if blob_kg != key_group:
        raise CorruptStateError(f"{where}: blob was written for {what} {blob_kg}")
    body = view[HEADER_SIZE:]
    if len(body) != length:
        raise CorruptStateError(
            f"{where}: snapshot blob truncated or padded: payload is {len(body)} bytes, "
            f"header says {length}"
        )
    if zlib.crc32(body) != crc:
        raise CorruptStateError(f"{where}: snapshot blob checksum mismatch (corrupt)")
    return _payloads.decode(_KIND_NAMES[kind], body, where)
