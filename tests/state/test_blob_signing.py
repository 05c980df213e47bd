"""State blobs signed with a key from the environment: the pickle trust boundary, guarded."""

from __future__ import annotations

import os
import pickle
import struct
import zlib
from pathlib import Path

import pytest

from asyncio_ops.state import CorruptStateError, ValueStateDescriptor
from asyncio_ops.state._blob import (
    HEADER_SIZE,
    KEYED_STATE,
    MAGIC,
    SIGNED_FORMAT_VERSION,
    SIGNING_KEY_ENV,
    seal,
    unseal,
)

from .conftest import BackendFactory


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
    assert all(b[4] == SIGNED_FORMAT_VERSION for b in blobs.values())
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
    blob = seal(KEYED_STATE, 5, [("x", 1)])
    if reader_key is None:
        monkeypatch.delenv(SIGNING_KEY_ENV)
        expected = rf"key group 5: the blob is signed; set {SIGNING_KEY_ENV}"
    else:
        monkeypatch.setenv(SIGNING_KEY_ENV, reader_key)
        expected = "key group 5: the blob's signature does not verify"
    with pytest.raises(CorruptStateError, match=expected):
        unseal(KEYED_STATE, 5, blob)


def test_with_a_key_set_an_unsigned_or_forged_blob_is_never_unpickled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    body = pickle.dumps(_Payload(marker))
    header = struct.Struct(">4sBBHII")
    unsigned = header.pack(MAGIC, 1, KEYED_STATE, 3, len(body), zlib.crc32(body)) + body
    forged = (
        header.pack(MAGIC, SIGNED_FORMAT_VERSION, KEYED_STATE, 3, len(body), zlib.crc32(body))
        + body
        + b"\x00" * 32
    )
    monkeypatch.setenv(SIGNING_KEY_ENV, "k1")
    with pytest.raises(CorruptStateError, match="an unsigned blob is not loaded"):
        unseal(KEYED_STATE, 3, unsigned)
    with pytest.raises(CorruptStateError, match="signature does not verify"):
        unseal(KEYED_STATE, 3, forged)
    assert not marker.exists()


def test_an_altered_signed_blob_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIGNING_KEY_ENV, "k1")
    blob = bytearray(seal(KEYED_STATE, 9, [("x", b"payload")]))
    blob[HEADER_SIZE + 2] ^= 0x01
    with pytest.raises(CorruptStateError, match="signature does not verify"):
        unseal(KEYED_STATE, 9, bytes(blob))
