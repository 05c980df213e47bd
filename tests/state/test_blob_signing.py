"""State blobs: typed Arrow payloads that loading never unpickles, and signing with a key
from the environment (for the user values that a pickle serializer wrote)."""

from __future__ import annotations

import os
import pickle
import struct
import zlib
from pathlib import Path

import pytest

from asyncio_ops._storage._container import FRAME_HEADER_SIZE, HEADER_SIZE, Kind, Section, encode
from asyncio_ops.state import CorruptStateError, ValueStateDescriptor
from asyncio_ops.state._blob import KEYED_STATE, SIGNING_KEY_ENV, seal, unseal

from .conftest import BackendFactory

_FLAGS = 12  # the header's flags field: bit 0, signed
_CONTAINER = struct.Struct("<8sHHHII")
_FRAME = struct.Struct("<IQQI")
_SECTION = struct.Struct("<iHQ")


def _container(body: bytes, *, flags: int = 0, version: int = 4, tag: int = 3) -> bytes:
    """A container of one frame (stored raw) of one KEYED_STATE section holding ``body``
    as it is (CRC right)."""
    head = _CONTAINER.pack(b"AOPSCKP1", version, KEYED_STATE, flags, 1, 1)
    stored = _SECTION.pack(tag, 0, len(body)) + body
    crc = zlib.crc32(stored, zlib.crc32(struct.pack("<HIQ", KEYED_STATE, 1, 0)))
    frame = _FRAME.pack(1, len(stored), 0, crc) + stored
    return head + frame + (b"\x00" * 32 if flags else b"")


# one value state, one list state: (state, kind, has_ttl, [(key, namespace, data)], typing)
PAYLOAD = [
    ("count", "value", False, [(b"i\x01", b"n", (None, b"v1"))], None),
    ("seen", "list", True, [(b"i\x02", b"n", [(1.5, b"a"), (None, b"b")])], None),
]


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_signed_snapshot_restores_with_the_key(
    make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SIGNING_KEY_ENV, "k1")
    src = make_backend()
    state = src.get_state(ValueStateDescriptor("count"))
    for key in range(20):
        src.set_current_key(key)
        state.update(key * 10)
    blobs = src.snapshot()
    assert all(b[_FLAGS] & 1 for b in blobs.values())
    dst = make_backend()
    assert dst.restore(blobs) == len(blobs)
    restored = dst.get_state(ValueStateDescriptor("count"))
    dst.set_current_key(7)
    assert restored.value() == 70


@pytest.mark.parametrize("reader_key", [None, "another"])
def test_a_signed_blob_needs_the_same_key(
    monkeypatch: pytest.MonkeyPatch, reader_key: str | None
) -> None:
    monkeypatch.setenv(SIGNING_KEY_ENV, "k1")
    blob = seal(KEYED_STATE, 5, PAYLOAD)
    if reader_key is None:
        monkeypatch.delenv(SIGNING_KEY_ENV)
        expected = rf"key group 5: snapshot blob is signed; set {SIGNING_KEY_ENV}"
    else:
        monkeypatch.setenv(SIGNING_KEY_ENV, reader_key)
        expected = "key group 5: snapshot blob: its signature does not verify"
    with pytest.raises(CorruptStateError, match=expected):
        unseal(KEYED_STATE, 5, blob)


def test_with_a_key_set_an_unsigned_or_forged_blob_is_never_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    body = pickle.dumps(_Payload(marker))
    unsigned = _container(body)
    forged = _container(body, flags=1)
    monkeypatch.setenv(SIGNING_KEY_ENV, "k1")
    with pytest.raises(CorruptStateError, match="is not signed and is not loaded"):
        unseal(KEYED_STATE, 3, unsigned)
    with pytest.raises(CorruptStateError, match="signature does not verify"):
        unseal(KEYED_STATE, 3, forged)
    assert not marker.exists()


def test_an_altered_signed_blob_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIGNING_KEY_ENV, "k1")
    blob = bytearray(seal(KEYED_STATE, 9, PAYLOAD))
    blob[HEADER_SIZE + FRAME_HEADER_SIZE + 2] ^= 0x01
    with pytest.raises(CorruptStateError, match="signature does not verify"):
        unseal(KEYED_STATE, 9, bytes(blob))


def test_a_payload_round_trips_as_typed_arrow() -> None:
    blob = seal(KEYED_STATE, 4, PAYLOAD)
    body = blob[HEADER_SIZE + FRAME_HEADER_SIZE :]
    assert body[:4] == b"\x28\xb5\x2f\xfd"  # one zstd frame (of a section: Arrow IPC)
    assert unseal(KEYED_STATE, 4, blob) == PAYLOAD


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_container_of_an_older_format_is_refused_unread(tmp_path: Path, version: int) -> None:
    marker = tmp_path / "pwned"
    blob = _container(pickle.dumps(_Payload(marker)), version=version)
    with pytest.raises(CorruptStateError, match=f"key group 3: .*format version {version}"):
        unseal(KEYED_STATE, 3, blob)
    assert not marker.exists()


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_a_blob_of_the_earlier_blob_format_is_refused_unread(tmp_path: Path, version: int) -> None:
    marker = tmp_path / "pwned"
    body = pickle.dumps(_Payload(marker))
    header = struct.Struct(">4sBBHII")
    blob = header.pack(b"AOSB", version, 1, 3, len(body), zlib.crc32(body)) + body
    with pytest.raises(CorruptStateError, match="a snapshot blob of an earlier release"):
        unseal(KEYED_STATE, 3, blob)
    assert not marker.exists()


def test_a_valid_frame_around_a_foreign_table_names_the_key_group() -> None:
    import pyarrow as pa

    blob, _ = encode(Kind.KEYED_STATE, [Section(6, pa.table({"x": [1, 2]}))])
    with pytest.raises(CorruptStateError, match=r"key group 6: .* has the columns \['x'\]"):
        unseal(KEYED_STATE, 6, blob)
    garbage = _container(b"not arrow at all", tag=6)
    with pytest.raises(CorruptStateError, match=r"key group 6: .* not a readable Arrow stream"):
        unseal(KEYED_STATE, 6, garbage)
