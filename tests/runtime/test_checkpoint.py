"""Checkpoint files: atomic, verified, and every kind of damage named."""

from __future__ import annotations

import os
import pickle
import re
import struct
import threading
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from asyncio_ops import CheckpointError, CorruptCheckpointError
from asyncio_ops._checkpoint import (
    FORMAT_VERSION,
    MAGIC,
    SIGNED_FORMAT_VERSION,
    CheckpointStorage,
    decode,
    encode,
)


def t(**columns: list[object]) -> pa.Table:
    return pa.table(columns)


def test_round_trip_and_listing(tmp_path: Path) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.check_writable()
    s.write(3, "subtask-00000.ckpt", t(rows=[1, 2, 3]))
    s.write(3, "kg-00007.ckpt", t(k=["a"], v=[1]))
    assert s.read(3, "subtask-00000.ckpt") == t(rows=[1, 2, 3])
    assert s.list_files(3) == ["kg-00007.ckpt", "subtask-00000.ckpt"]
    assert s.list_files(3, "kg-") == ["kg-00007.ckpt"]
    assert s.versions() == [3]
    assert s.exists(3, "kg-00007.ckpt") and not s.exists(3, "kg-00008.ckpt")
    s.delete_versions([3])
    assert s.versions() == []


def test_file_uri_works_like_a_path(tmp_path: Path) -> None:
    s = CheckpointStorage(f"file://{tmp_path}", "op")
    s.write(1, "x.ckpt", t(x=[42]))
    assert (tmp_path / "op" / "v0000000001" / "x.ckpt").is_file()
    assert CheckpointStorage(str(tmp_path), "op").read(1, "x.ckpt") == t(x=[42])


def test_a_torn_temp_file_is_never_read(tmp_path: Path) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "subtask-00000.ckpt", t(s=["whole"]))
    torn = tmp_path / "op" / "v0000000001" / "subtask-00001.ckpt.tmp-deadbeef"
    torn.write_bytes(encode(t(s=["half"]))[:10])  # a writer died half-way
    assert s.list_files(1) == ["subtask-00000.ckpt"]


def test_truncated_file_is_named(tmp_path: Path) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "kg-00001.ckpt", t(n=list(range(1000))))
    f = tmp_path / "op" / "v0000000001" / "kg-00001.ckpt"
    f.write_bytes(f.read_bytes()[:-7])
    with pytest.raises(CorruptCheckpointError, match=r"kg-00001\.ckpt.*truncated"):
        s.read(1, "kg-00001.ckpt")
    f.write_bytes(b"AOPS")
    with pytest.raises(CorruptCheckpointError, match=r"kg-00001\.ckpt"):
        s.read(1, "kg-00001.ckpt")


def test_bit_flip_fails_the_checksum(tmp_path: Path) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "kg-00002.ckpt", t(payload=["x" * 100]))
    f = tmp_path / "op" / "v0000000001" / "kg-00002.ckpt"
    data = bytearray(f.read_bytes())
    data[-20] ^= 0x04
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"kg-00002\.ckpt fails its checksum"):
        s.read(1, "kg-00002.ckpt")


def test_newer_format_version_is_refused_by_name() -> None:
    newer = SIGNED_FORMAT_VERSION + 1  # 3 is a signed file of FORMAT_VERSION's frame
    data = bytearray(encode(t(s=["future"])))
    data[8] = newer  # the u16 after the magic
    with pytest.raises(CorruptCheckpointError, match=rf"format version {newer}.*upgrade"):
        decode(bytes(data), "some/file.ckpt")


class _Payload:
    """Unpickling this runs a shell command: what a crafted checkpoint file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _framed(version: int, body: bytes) -> bytes:
    return struct.pack("<8sHQI", MAGIC, version, len(body), zlib.crc32(body)) + body


@pytest.mark.parametrize("version", [1, FORMAT_VERSION])
def test_a_crafted_pickle_with_a_valid_header_and_crc_never_runs(
    tmp_path: Path, version: int
) -> None:
    marker = tmp_path / "pwned"
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "subtask-00000.ckpt", t(x=[1]))
    victim = tmp_path / "op" / "v0000000001" / "subtask-00000.ckpt"
    victim.write_bytes(_framed(version, pickle.dumps(_Payload(marker))))
    expected = "pickle" if version == 1 else "not a readable Arrow stream"
    with pytest.raises(CorruptCheckpointError, match=rf"subtask-00000\.ckpt.*{expected}"):
        s.read(1, "subtask-00000.ckpt")
    assert not marker.exists()


def test_not_a_checkpoint_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(CorruptCheckpointError, match="not an asyncio_ops checkpoint"):
        decode(b"PK\x03\x04" + b"\x00" * 40, "x.zip")
    s = CheckpointStorage(str(tmp_path), "op")
    with pytest.raises(CheckpointError, match=r"missing"):
        s.read(5, "subtask-00000.ckpt")


def test_location_under_a_file_is_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match=r"not writable"):
        CheckpointStorage(str(blocker / "ckpt"), "op").check_writable()


@pytest.mark.parametrize("churned", ["version directory", "operator directory"])
def test_listing_a_directory_another_task_creates_or_deletes_meanwhile(
    tmp_path: Path, churned: str
) -> None:
    """Tasks of one batch start together: one lists a version directory while another
    creates it (its first write) or prunes it. The listing sees it or not, never fails."""
    s = CheckpointStorage(str(tmp_path), "op")
    root = tmp_path / "op"
    if churned == "version directory":
        root.mkdir()
        target, listing = root / "v0000000001", lambda: s.list_files(1)
    else:
        target, listing = root, s.versions
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            target.mkdir()
            target.rmdir()

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        seen = [listing() for _ in range(20_000)]
    finally:
        stop.set()
        thread.join()
    assert seen == [[]] * len(seen)  # an empty directory, or none: nothing listed


def test_a_valid_frame_of_the_wrong_shape_names_the_file() -> None:
    from asyncio_ops._runtime._versions import _blob, _column

    manifest = pa.table({"key_group": [1, 2]})  # a keyed manifest without its "file" column
    with pytest.raises(CheckpointError, match=r"checkpoint file /ck/subtask-00000 lacks .*'file'"):
        _column(manifest, "file", "/ck/subtask-00000")
    two = pa.table({"blob": [b"a", b"b"]})  # a key-group file must hold one blob
    with pytest.raises(CheckpointError, match=r"checkpoint file /ck/kg-00003 does not hold one"):
        _blob(two, "/ck/kg-00003")


def test_arrow_offsets_pointing_outside_their_buffer_are_an_error_naming_the_file(
    tmp_path: Path,
) -> None:
    # A valid header and checksum around an Arrow stream whose string offsets point far
    # past the data: reading its values would read outside the buffer (a crash).
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "results-p0-x-0.ckpt", t(v=["a", "bb", "ccc"]))
    victim = tmp_path / "op" / "v0000000001" / "results-p0-x-0.ckpt"
    body = victim.read_bytes()[struct.calcsize("<8sHQI") :]
    offsets = struct.pack("<4i", 0, 1, 3, 6)
    assert body.count(offsets) == 1
    crafted = body.replace(offsets, struct.pack("<4i", 0, 1, 3, 0x7FFF0000))
    victim.write_bytes(_framed(FORMAT_VERSION, crafted))
    with pytest.raises(
        CorruptCheckpointError, match=r"results-p0-x-0\.ckpt verifies but is not a readable"
    ):
        s.read(1, "results-p0-x-0.ckpt")


def test_a_partition_writes_its_key_groups_in_one_file_and_earlier_files_still_read(
    tmp_path: Path,
) -> None:
    """One ``kg-p<i>-<token>`` file per partition, a row per key group; a partition owning
    some of them reads just those; a one-blob ``kg-<kg>`` file and a ``file`` manifest of
    earlier releases still read; a key group the manifest names but the file lacks is an
    error naming the file."""
    from asyncio_ops._keygroups import KeyGroupRange
    from asyncio_ops._runtime._versions import _blob_table, read_version, write_version

    s = CheckpointStorage(str(tmp_path), "op")
    write_version(s, 4, 0, 2, True, {3: (None, b"three"), 70: (None, b"seventy")}, b"ops0", {},
                  writer="w0")  # fmt: skip
    write_version(s, 4, 1, 2, True, {}, b"ops1", {})
    assert s.list_files(4, "kg-") == ["kg-p00000-w0.ckpt"]
    found = read_version(s, 4)
    assert found is not None
    assert [(kg, b) for _, kg, b in found.key_group_blobs(KeyGroupRange(64, 127), 128)] == [
        (70, b"seventy")
    ]
    s.write(4, "kg-00005.ckpt", _blob_table(b"five"))  # an earlier release's file
    manifest = pa.table({"key_group": pa.array([5, 9], pa.int32()),
                         "file": ["kg-00005.ckpt", "kg-p00000-w0.ckpt"]})  # fmt: skip
    s.write(4, "subtask-00001.ckpt", manifest.replace_schema_metadata(
        found.manifests[1].schema.metadata))  # fmt: skip
    found = read_version(s, 4)
    assert found is not None
    assert [b for _, _, b in found.key_group_blobs(KeyGroupRange(0, 5), 128)] == [b"three", b"five"]
    with pytest.raises(CheckpointError, match=r"kg-p00000-w0\.ckpt lacks key group 9"):
        found.key_group_blobs(KeyGroupRange(9, 9), 128)


def test_a_chain_is_a_full_blob_then_deltas_and_retention_keeps_what_chains_name(
    tmp_path: Path,
) -> None:
    """A delta extends its key group's chain, a full blob restarts it, an untouched key
    group keeps it; pruning keeps every version the oldest retained version's chains
    name, and deletes the rest."""
    from asyncio_ops._keygroups import KeyGroupRange
    from asyncio_ops._runtime._versions import (
        ChainReader,
        prune_versions,
        read_version,
        write_version,
    )

    s = CheckpointStorage(str(tmp_path), "op")
    chains = write_version(s, 0, 0, 1, True, {1: (None, b"f1"), 2: (None, b"f2")}, b"o", {},
                           writer="a")  # fmt: skip
    chains = write_version(s, 1, 0, 1, True, {1: ([b"k"], b"d1")}, b"o", {}, chains=chains,
                           writer="b")  # fmt: skip
    chains = write_version(s, 2, 0, 1, True, {2: (None, b"g2")}, b"o", {}, chains=chains,
                           writer="c")  # fmt: skip
    assert chains == {1: ((0, "kg-p00000-a.ckpt", 2), (1, "kg-p00000-b.ckpt", 3)),
                      2: ((2, "kg-p00000-c.ckpt", 2),)}  # fmt: skip
    found = read_version(s, 2)
    assert found is not None
    read = found.chains(KeyGroupRange(0, 3), 128)
    assert read == chains
    reader = ChainReader(s)
    assert [(k, b) for _, k, b in reader.read(1, read[1])] == [(None, b"f1"), ([b"k"], b"d1")]
    with pytest.raises(CheckpointError, match=r"key group 1 is a delta"):
        found.key_group_blobs(KeyGroupRange(1, 1), 128)
    write_version(s, 3, 0, 1, True, {}, b"o", {}, chains=chains)
    prune_versions(s, 3, 2)  # retains 2 and 3; 2's chains name version 0 too
    assert s.versions() == [0, 1, 2, 3]
    write_version(s, 4, 0, 1, True, {1: (None, b"h1")}, b"o", {}, chains=chains)
    write_version(s, 5, 0, 1, True, {}, b"o", {}, chains={1: ((4, "x", 1),), 2: chains[2]})
    prune_versions(s, 5, 2)  # retains 4 and 5: they name versions 2 and 4
    assert s.versions() == [2, 3, 4, 5]


# -- signed files (a key in ASYNCIO_OPS_STATE_SIGNING_KEY) -----------------------------------


@pytest.fixture
def signing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCIO_OPS_STATE_SIGNING_KEY", "k-1")


def test_a_signed_file_round_trips_and_needs_the_key(
    tmp_path: Path, signing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "results-p0-a-0.ckpt", t(v=[1, 2]))
    assert s.read(1, "results-p0-a-0.ckpt").column("v").to_pylist() == [1, 2]
    monkeypatch.setenv("ASYNCIO_OPS_STATE_SIGNING_KEY", "another key")
    with pytest.raises(CorruptCheckpointError, match=r"results-p0-a-0\.ckpt: its signature"):
        s.read(1, "results-p0-a-0.ckpt")
    monkeypatch.delenv("ASYNCIO_OPS_STATE_SIGNING_KEY")
    with pytest.raises(CorruptCheckpointError, match=r"is signed; set ASYNCIO_OPS_STATE_SIGNING"):
        s.read(1, "results-p0-a-0.ckpt")


def test_a_forged_unsigned_replay_log_is_refused_while_a_key_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "results-p0-a-0.ckpt", t(v=[666]))  # written without a key: a forgery
    monkeypatch.setenv("ASYNCIO_OPS_STATE_SIGNING_KEY", "k-1")
    with pytest.raises(CorruptCheckpointError, match=r"results-p0-a-0\.ckpt is not signed"):
        s.read(1, "results-p0-a-0.ckpt")


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (("op", 0, "kg-p00000.ckpt"), ("op", 1, "kg-p00000.ckpt")),  # an older version
        (("other", 1, "results-p0-a-0.ckpt"), ("op", 1, "results-p0-a-0.ckpt")),  # operator
        (("op", 1, "ops-00001.ckpt"), ("op", 1, "ops-00000.ckpt")),  # another partition
        (("op", 1, "subtask-00000.ckpt"), ("op", 1, "ops-00000.ckpt")),  # another kind
    ],
)
def test_a_signed_file_copied_to_another_identity_does_not_verify(
    tmp_path: Path, signing: None, source: tuple[str, int, str], target: tuple[str, int, str]
) -> None:
    uid, version, name = source
    CheckpointStorage(str(tmp_path), uid).write(version, name, t(v=[3]))
    to = CheckpointStorage(str(tmp_path), target[0])
    to.write(target[1], target[2], t(v=[2]))
    data = (tmp_path / uid / f"v{version:010d}" / name).read_bytes()
    (tmp_path / target[0] / f"v{target[1]:010d}" / target[2]).write_bytes(data)
    with pytest.raises(CorruptCheckpointError, match=rf"{re.escape(target[2])}: its signature"):
        to.read(target[1], target[2])
