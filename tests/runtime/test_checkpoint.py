"""Checkpoint files: atomic, verified, and every kind of damage named."""

from __future__ import annotations

import os
import pickle
import re
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncio_ops import CheckpointError, CorruptCheckpointError
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops._storage._container import (
    DELTA,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    Kind,
    Section,
    decode,
    encode,
)

K = Kind.REPLAY_LOG  # the kind of the plain tables below
_FRAME = struct.Struct("<IQQI")  # sections, stored length, raw length (0: raw), CRC
_SECTION = struct.Struct("<iHQ")  # tag, part, length


def t(**columns: list[object]) -> pa.Table:
    return pa.table(columns)


def _contained(body: bytes, kind: int = K, version: int = FORMAT_VERSION) -> bytes:
    """A container of one frame of one section holding ``body`` as it is (stored raw),
    its CRC right."""
    head = struct.pack("<8sHHHII", MAGIC, version, kind, 0, 1, 1)
    stored = _SECTION.pack(0, 0, len(body)) + body
    crc = zlib.crc32(stored, zlib.crc32(struct.pack("<HIQ", kind, 1, 0)))
    return head + _FRAME.pack(1, len(stored), 0, crc) + stored


def test_round_trip_and_listing(tmp_path: Path) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.check_writable()
    s.write(3, "subtask-00000.ckpt", K, t(rows=[1, 2, 3]))
    s.write(3, "kg-00007.ckpt", K, t(k=["a"], v=[1]))
    assert s.read(3, "subtask-00000.ckpt", K) == t(rows=[1, 2, 3])
    assert s.list_files(3) == ["kg-00007.ckpt", "subtask-00000.ckpt"]
    assert s.list_files(3, "kg-") == ["kg-00007.ckpt"]
    assert s.versions() == [3]
    assert s.exists(3, "kg-00007.ckpt") and not s.exists(3, "kg-00008.ckpt")
    s.delete_versions([3])
    assert s.versions() == []


def test_file_uri_works_like_a_path(tmp_path: Path) -> None:
    s = CheckpointStorage(f"file://{tmp_path}", "op")
    s.write(1, "x.ckpt", K, t(x=[42]))
    assert (tmp_path / "op" / "v0000000001" / "x.ckpt").is_file()
    assert CheckpointStorage(str(tmp_path), "op").read(1, "x.ckpt", K) == t(x=[42])


def test_a_torn_temp_file_is_never_read(tmp_path: Path) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "subtask-00000.ckpt", K, t(s=["whole"]))
    torn = tmp_path / "op" / "v0000000001" / "subtask-00001.ckpt.tmp-deadbeef"
    torn.write_bytes(encode(K, [Section(0, t(s=["half"]))])[0][:10])  # a writer died half-way
    assert s.list_files(1) == ["subtask-00000.ckpt"]


def test_truncated_file_is_named(tmp_path: Path) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "kg-00001.ckpt", K, t(n=list(range(1000))))
    f = tmp_path / "op" / "v0000000001" / "kg-00001.ckpt"
    f.write_bytes(f.read_bytes()[:-7])
    with pytest.raises(CorruptCheckpointError, match=r"kg-00001\.ckpt.*truncated"):
        s.read(1, "kg-00001.ckpt", K)
    f.write_bytes(b"AOPS")
    with pytest.raises(CorruptCheckpointError, match=r"kg-00001\.ckpt"):
        s.read(1, "kg-00001.ckpt", K)


def test_bit_flip_fails_the_checksum(tmp_path: Path) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "kg-00002.ckpt", K, t(payload=["x" * 100]))
    f = tmp_path / "op" / "v0000000001" / "kg-00002.ckpt"
    data = bytearray(f.read_bytes())
    data[-20] ^= 0x04
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"kg-00002\.ckpt fails its checksum"):
        s.read(1, "kg-00002.ckpt", K)


def test_newer_format_version_is_refused_by_name() -> None:
    newer = FORMAT_VERSION + 1
    data = bytearray(encode(K, [Section(0, t(s=["future"]))])[0])
    data[8] = newer  # the u16 after the magic
    with pytest.raises(CorruptCheckpointError, match=rf"format version {newer}.*upgrade"):
        decode(bytes(data), K, "some/file.ckpt", error=CorruptCheckpointError)


def test_a_file_of_another_kind_is_refused_by_name(tmp_path: Path) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "ops-00000.ckpt", Kind.MANIFEST, t(x=[1]))
    with pytest.raises(CorruptCheckpointError, match=r"ops-00000\.ckpt holds manifest, not"):
        s.read(1, "ops-00000.ckpt", Kind.OPERATOR_STATE)


class _Payload:
    """Unpickling this runs a shell command: what a crafted checkpoint file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _framed(version: int, body: bytes) -> bytes:
    """A file of the earlier frame (format versions 1 to 3): magic, version, length, CRC."""
    return struct.pack("<8sHQI", MAGIC, version, len(body), zlib.crc32(body)) + body


@pytest.mark.parametrize("version", [1, 2, 3, FORMAT_VERSION])
def test_a_crafted_pickle_with_a_valid_header_and_crc_never_runs(
    tmp_path: Path, version: int
) -> None:
    marker = tmp_path / "pwned"
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "subtask-00000.ckpt", K, t(x=[1]))
    victim = tmp_path / "op" / "v0000000001" / "subtask-00000.ckpt"
    body = pickle.dumps(_Payload(marker))
    victim.write_bytes(_contained(body) if version == FORMAT_VERSION else _framed(version, body))
    expected = {
        1: "format version 1 .pickle",
        2: "format version 2 .an earlier release",
        3: "format version 3",
        FORMAT_VERSION: "not a readable Arrow stream",
    }[version]
    with pytest.raises(CorruptCheckpointError, match=rf"subtask-00000\.ckpt.*{expected}"):
        s.read(1, "subtask-00000.ckpt", K)
    assert not marker.exists()


def test_not_a_checkpoint_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(CorruptCheckpointError, match="not an asyncio_ops checkpoint"):
        decode(b"PK\x03\x04" + b"\x00" * 40, K, "x.zip", error=CorruptCheckpointError)
    s = CheckpointStorage(str(tmp_path), "op")
    with pytest.raises(CheckpointError, match=r"missing"):
        s.read(5, "subtask-00000.ckpt", Kind.MANIFEST)


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


def test_a_valid_file_of_the_wrong_shape_names_the_file(tmp_path: Path) -> None:
    from asyncio_ops._keygroups import KeyGroupRange
    from asyncio_ops._runtime._versions import VersionFiles

    s = CheckpointStorage(str(tmp_path), "op")
    manifest = pa.table({"key_group": pa.array([1, 2], pa.int32())})  # no chains
    found = VersionFiles(s, 0, [manifest], ["/ck/subtask-00000"], [0], 1)
    with pytest.raises(CheckpointError, match=r"checkpoint file /ck/subtask-00000 has the colum"):
        found.chains(KeyGroupRange(0, 3), 128)
    s.write(0, "ops-00000.ckpt", Kind.OPERATOR_STATE, t(x=[1]))  # not operator state's table
    found = VersionFiles(s, 0, [manifest], ["/ck/subtask-00000"], [0], 1)
    with pytest.raises(CorruptCheckpointError, match=r"ops-00000\.ckpt: .*has the columns"):
        found.operator_states()


def test_arrow_offsets_pointing_outside_their_buffer_are_an_error_naming_the_file(
    tmp_path: Path,
) -> None:
    # A valid header and checksum around an Arrow stream whose string offsets point far
    # past the data: reading its values would read outside the buffer (a crash).
    s = CheckpointStorage(str(tmp_path), "op")
    sink = pa.BufferOutputStream()
    table = t(v=["a", "bb", "ccc"])
    with pa.ipc.new_stream(sink, table.schema) as writer:  # uncompressed: offsets visible
        writer.write_table(table)
    body = sink.getvalue().to_pybytes()
    offsets = struct.pack("<4i", 0, 1, 3, 6)
    assert body.count(offsets) == 1
    crafted = body.replace(offsets, struct.pack("<4i", 0, 1, 3, 0x7FFF0000))
    s.write(1, "results-p0-x-0.ckpt", K, table)
    victim = tmp_path / "op" / "v0000000001" / "results-p0-x-0.ckpt"
    victim.write_bytes(_contained(crafted))
    with pytest.raises(
        CorruptCheckpointError, match=r"results-p0-x-0\.ckpt verifies but is not a readable"
    ):
        s.read(1, "results-p0-x-0.ckpt", K)


def _kg(kg: int, value: str, part: int = 0) -> Section:
    return Section(kg, t(v=[value]), part)


def test_a_partition_writes_its_key_groups_in_one_file_and_others_read_just_theirs(
    tmp_path: Path,
) -> None:
    """One ``kg-p<i>-<token>`` file per partition, a section per key group; a partition
    owning some of them reads just those byte ranges; a manifest whose offsets point at
    another key group's section is an error naming the file."""
    from asyncio_ops._keygroups import KeyGroupRange
    from asyncio_ops._runtime._versions import read_version, write_version

    s = CheckpointStorage(str(tmp_path), "op")
    chains = write_version(s, 4, 0, 2, True, {3: _kg(3, "three"), 70: _kg(70, "seventy")},
                           [], {}, writer="w0")  # fmt: skip
    write_version(s, 4, 1, 2, True, {}, [], {}, writer="w1")
    # partition 1 changed nothing: its file holds no section, its name the oldest version
    # its chains name (retention lists it), here its own
    assert s.list_files(4, "kg-") == ["kg-p00000-w0-from0000000004.ckpt",
                                      "kg-p00001-w1-from0000000004.ckpt"]  # fmt: skip
    assert s.read_sections(4, "kg-p00001-w1-from0000000004.ckpt", Kind.KEY_GROUPS) == []
    (_, name, offset, _, _) = chains[70][0]
    assert (name, offset) == ("kg-p00000-w0-from0000000004.ckpt", HEADER_SIZE)  # one frame
    found = read_version(s, 4)
    assert found is not None
    got = found.key_group_sections(KeyGroupRange(64, 127), 128)
    assert [(sec.tag, sec.table.column("v").to_pylist()) for _, sec in got] == [(70, ["seventy"])]
    stray = {9: chains[70]}  # a key group the file does not hold
    write_version(s, 5, 0, 1, True, {}, [], {}, chains=stray)
    later = read_version(s, 5)
    assert later is not None
    with pytest.raises(CheckpointError, match=r"kg-p00000-w0-from0+4\.ckpt lacks key group 9 "):
        later.key_group_sections(KeyGroupRange(0, 63), 128)


def test_full_sections_given_one_at_a_time_start_chains_where_the_file_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``write_version(full=...)`` takes full sections from an iterator as it writes the
    file (first, in their order, a frame each here): each starts its key group's chain
    at its own frame, beside the deltas and the chains kept; a full section of a key
    group also given in ``sections``, given twice, or not of part FULL is refused."""
    import asyncio_ops._storage._container as container
    from asyncio_ops._keygroups import KeyGroupRange
    from asyncio_ops._runtime._versions import read_chains, read_version, write_version

    monkeypatch.setattr(container, "_FRAME_BYTES", 1)  # a frame per section
    s = CheckpointStorage(str(tmp_path), "op")
    base = write_version(s, 1, 0, 1, True, {3: _kg(3, "three"), 9: _kg(9, "nine")}, [], {})
    made: list[int] = []

    def full() -> Iterator[Section]:
        for kg, value in ((5, "five"), (70, "seventy")):
            made.append(kg)
            yield _kg(kg, value)

    chains = write_version(s, 2, 0, 1, True, {3: _kg(3, "three+", DELTA)}, [], {},
                           chains=base, writer="w2", full=full())  # fmt: skip
    assert made == [5, 70]
    assert chains[9] == base[9] and len(chains[3]) == 2 and chains[3][0] == base[3][0]
    five, seventy, delta = chains[5][0], chains[70][0], chains[3][1]
    assert five[:2] == seventy[:2] == delta[:2] == (2, "kg-p00000-w2-from0000000001.ckpt")
    assert five[2] == HEADER_SIZE and seventy[2] == five[2] + five[3] < delta[2]
    found = read_version(s, 2)
    assert found is not None and found.chains(KeyGroupRange(0, 127), 128) == chains
    got = read_chains(s, chains)
    assert {kg: [sec.table.column("v").to_pylist() for _, sec in links]
            for kg, links in got.items()} == {
        3: [["three"], ["three+"]], 5: [["five"]], 9: [["nine"]], 70: [["seventy"]]
    }  # fmt: skip
    for sections, bad in (
        ({5: _kg(5, "again", DELTA)}, [_kg(5, "five")]),
        ({}, [_kg(5, "five"), _kg(5, "five")]),
        ({}, [_kg(5, "five", DELTA)]),
    ):
        with pytest.raises(CheckpointError, match="key group 5: a full section given twice"):
            write_version(s, 3, 0, 1, True, sections, [], {}, chains=chains, full=iter(bad))


def test_a_restore_parses_one_frame_at_a_time_and_applies_it_before_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``apply_chains`` reads the chains' files, then parses their frames one at a time
    (files in version order) and applies each link as its frame is parsed: never
    every section decoded at once. Each key group's links still come in chain order,
    and a link its file lacks is named once the files are read."""
    import asyncio_ops._runtime._versions as versions
    import asyncio_ops._storage._container as container
    from asyncio_ops._runtime._versions import apply_chains, write_version

    monkeypatch.setattr(container, "_FRAME_BYTES", 1)  # a frame per section
    s = CheckpointStorage(str(tmp_path), "op")
    chains = write_version(s, 1, 0, 1, True, {k: _kg(k, f"v{k}") for k in (3, 9, 70)}, [], {})
    chains = write_version(s, 2, 0, 1, True, {3: _kg(3, "d3", DELTA), 70: _kg(70, "d70", DELTA)},
                           [], {}, chains=chains)  # fmt: skip
    events: list[str] = []
    parse = versions.frame_sections

    def parsed(frame: Any, where: str, error: Any) -> list[Section]:
        got = parse(frame, where, error)
        events.append("parse " + ",".join(str(sec.tag) for sec in got))
        return got

    monkeypatch.setattr(versions, "frame_sections", parsed)
    apply_chains(s, chains, lambda sec, where: events.append(
        f"apply {sec.tag} {sec.table.column('v').to_pylist()[0]}"))  # fmt: skip
    assert events == [
        "parse 3",
        "apply 3 v3",
        "parse 9",
        "apply 9 v9",
        "parse 70",
        "apply 70 v70",
        "parse 3",
        "apply 3 d3",
        "parse 70",
        "apply 70 d70",
    ]
    lost = {**chains, 9: (*chains[9], (2, chains[3][1][1], *chains[3][1][2:]))}
    with pytest.raises(CorruptCheckpointError, match=r"from0+1\.ckpt lacks key group 9 "):
        apply_chains(s, lost, lambda sec, where: None)


def test_of_two_attempts_the_manifest_written_last_is_in_force_whole(tmp_path: Path) -> None:
    """Two attempts of one task (a speculative copy) write one version: their data files
    have names of their own and only the manifest names them, so whichever manifest
    lands last, the version is that attempt's key groups and operator state, never the
    other's operator state beside them (the operator state file was one name for both
    before)."""
    from asyncio_ops._keygroups import KeyGroupRange
    from asyncio_ops._runtime._versions import read_version, write_version

    s = CheckpointStorage(str(tmp_path), "op")
    manifest = tmp_path / "op" / "v0000000003" / "subtask-00000.ckpt"

    def attempt(who: str) -> bytes:
        write_version(s, 3, 0, 1, False, {5: _kg(5, who)},
                      [("in-flight", "split", [who.encode()])], {}, writer=who)  # fmt: skip
        return manifest.read_bytes()

    first = attempt("a")
    attempt("b")
    for landed_last, who in ((None, "b"), (first, "a")):
        if landed_last is not None:
            manifest.write_bytes(landed_last)  # attempt a's manifest upload ends last
        found = read_version(s, 3)
        assert found is not None
        (((_, states),)) = found.operator_states()
        assert states == [("in-flight", "split", [who.encode()])]
        got = found.key_group_sections(KeyGroupRange(0, 127), 128)
        assert [sec.table.column("v").to_pylist() for _, sec in got] == [[who]]


def test_a_partition_reads_only_the_frames_of_its_key_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sections share a frame up to about 4 MiB; a partition owning some key groups
    reads only their frames' byte ranges: damage in another frame is not read, damage
    in its own is named."""
    import asyncio_ops._storage._container as container
    from asyncio_ops._keygroups import KeyGroupRange
    from asyncio_ops._runtime._versions import read_version, write_version

    monkeypatch.setattr(container, "_FRAME_BYTES", 1)  # a frame per section
    s = CheckpointStorage(str(tmp_path), "op")
    chains = write_version(s, 4, 0, 1, True, {3: _kg(3, "three"), 70: _kg(70, "seventy")},
                           [], {}, writer="w0")  # fmt: skip
    (_, name, offset, length, _) = chains[70][0]
    assert offset == HEADER_SIZE + chains[3][0][3]
    found = read_version(s, 4)
    assert found is not None
    path = tmp_path / "op" / "v0000000004" / name
    data = bytearray(path.read_bytes())
    assert len(data) == offset + length
    data[offset - 3] ^= 0x10  # inside key group 3's frame
    path.write_bytes(bytes(data))
    got = found.key_group_sections(KeyGroupRange(64, 127), 128)
    assert [(sec.tag, sec.table.column("v").to_pylist()) for _, sec in got] == [(70, ["seventy"])]
    with pytest.raises(CorruptCheckpointError, match=r"kg-p00000-w0-from0+4\.ckpt fails its check"):
        found.key_group_sections(KeyGroupRange(0, 63), 128)


def test_a_chain_is_a_full_section_then_deltas_and_retention_keeps_what_chains_name(
    tmp_path: Path,
) -> None:
    """A delta extends its key group's chain, a full section restarts it, an untouched
    key group keeps it; adjacent sections of one file are one ranged read; pruning keeps
    every version the oldest retained version's chains name, and deletes the rest."""
    from asyncio_ops._keygroups import KeyGroupRange
    from asyncio_ops._runtime._retention import Retention
    from asyncio_ops._runtime._versions import read_chains, read_version, write_version

    s = CheckpointStorage(str(tmp_path), "op")
    chains = write_version(s, 0, 0, 1, True, {1: _kg(1, "f1"), 2: _kg(2, "f2")}, [], {},
                           writer="a")  # fmt: skip
    chains = write_version(s, 1, 0, 1, True, {1: _kg(1, "d1", DELTA)}, [], {}, chains=chains,
                           writer="b")  # fmt: skip
    chains = write_version(s, 2, 0, 1, True, {2: _kg(2, "g2")}, [], {}, chains=chains,
                           writer="c")  # fmt: skip
    # a file's name says the oldest version its partition's chains then name
    assert [(v, f) for v, f, *_ in chains[1]] == [
        (0, "kg-p00000-a-from0000000000.ckpt"), (1, "kg-p00000-b-from0000000000.ckpt")
    ]  # fmt: skip
    assert [(v, f) for v, f, *_ in chains[2]] == [(2, "kg-p00000-c-from0000000000.ckpt")]
    found = read_version(s, 2)
    assert found is not None
    read = found.chains(KeyGroupRange(0, 3), 128)
    assert read == chains
    got = read_chains(s, {1: read[1]})
    assert [(sec.part, sec.table.column("v").to_pylist()) for _, sec in got[1]] == [
        (0, ["f1"]),
        (DELTA, ["d1"]),
    ]
    with pytest.raises(CheckpointError, match=r"key group 1's chain starts with a delta"):
        read_chains(s, {1: read[1][1:]})
    assert read_chains(s, {1: read[1][1:]}, tails={1})[1][0][1].part == DELTA
    with pytest.raises(CheckpointError, match=r"key group 1 has a chain of deltas"):
        found.key_group_sections(KeyGroupRange(1, 1), 128)
    with pytest.raises(CheckpointError, match=r"key group 5: a delta without a full"):
        write_version(s, 3, 0, 1, True, {5: _kg(5, "x", DELTA)}, [], {}, chains=chains)
    write_version(s, 3, 0, 1, True, {}, [], {}, chains=chains)
    Retention(s, 3, 2, None).join()  # retains 2 and 3; 2's chains name version 0 too
    assert s.versions() == [0, 1, 2, 3]
    write_version(s, 4, 0, 1, True, {1: _kg(1, "h1")}, [], {}, chains=chains)
    write_version(s, 5, 0, 1, True, {}, [], {}, chains={1: ((4, "x", 0, 1, 1),), 2: chains[2]})
    Retention(s, 5, 2, None).join()  # retains 4 and 5: they name versions 2 and 4
    assert s.versions() == [2, 3, 4, 5]


def test_retention_finds_the_oldest_version_chains_name_in_file_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning lists the oldest retained version once and reads no manifest whose
    partition's key-group file names the oldest version its chains name; of two attempts
    it keeps what the older-reaching one names (one may have failed after its data file,
    the manifest in force being the other's); a manifest without such a file (earlier
    releases) is read."""
    from asyncio_ops._runtime._retention import Retention
    from asyncio_ops._runtime._versions import write_version

    s = CheckpointStorage(str(tmp_path), "op")
    reads: list[str] = []
    read = CheckpointStorage.read

    def counted(self: CheckpointStorage, version: Any, name: str, kind: Kind) -> Any:
        reads.append(name)
        return read(self, version, name, kind)

    monkeypatch.setattr(CheckpointStorage, "read", counted)
    kept = write_version(s, 0, 0, 2, True, {1: _kg(1, "f1")}, [], {}, writer="a")
    write_version(s, 0, 1, 2, True, {2: _kg(2, "f2")}, [], {}, writer="a")
    for v in (1, 2):  # partition 0 keeps key group 1's chain from 0, partition 1 moves on
        write_version(s, v, 0, 2, True, {}, [], {}, chains=kept, writer="b")
        write_version(s, v, 1, 2, True, {2: _kg(2, f"g{v}")}, [], {}, writer="b")
    Retention(s, 2, 2, None).join()  # retains 1 and 2: 1's chains name version 0
    assert s.versions() == [0, 1, 2] and reads == []
    # version 3: partition 0's attempt "late" wrote a full section (its chains from 3)
    # and failed; attempt "c", whose manifest is in force, named version 0 still
    write_version(s, 3, 0, 2, True, {1: _kg(1, "h1")}, [], {}, writer="late")
    write_version(s, 3, 0, 2, True, {}, [], {}, chains=kept, writer="c")
    write_version(s, 3, 1, 2, True, {2: _kg(2, "g3")}, [], {}, writer="c")
    for v in (4, 5):
        write_version(s, v, 0, 2, True, {1: _kg(1, f"i{v}")}, [], {}, writer="d")
        write_version(s, v, 1, 2, True, {2: _kg(2, f"j{v}")}, [], {}, writer="d")
    Retention(s, 4, 2, None).join()  # retains 3 and 4: 3's chains name version 0
    assert s.versions() == [0, 1, 2, 3, 4, 5] and reads == []
    Retention(s, 5, 2, None).join()  # retains 4 and 5, whose chains start at 4 and 5
    assert s.versions() == [4, 5] and reads == []
    # partition 1's file of version 4 as an earlier release named it: its manifest is read
    (old,) = s.list_files(4, "kg-p00001-")
    version_dir = tmp_path / "op" / "v0000000004"
    (version_dir / old).rename(version_dir / "kg-p00001-d.ckpt")
    write_version(s, 6, 0, 2, True, {1: _kg(1, "k6")}, [], {}, writer="e")
    write_version(s, 6, 1, 2, True, {2: _kg(2, "l6")}, [], {}, writer="e")
    Retention(s, 6, 3, None).join()
    assert reads == ["subtask-00001.ckpt"] and s.versions() == [4, 5, 6]


def test_retention_keeps_what_a_readers_lease_holds_until_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease (an empty file ``lease-<from>-<until>-<id>`` beside the versions) keeps
    every version from its first on while it lasts; once it has ended, or if it claims
    to end further ahead than any reader takes one, retention deletes it and what it
    held. Time is the leases' clock, set by the test."""
    from asyncio_ops._runtime import _leases
    from asyncio_ops._runtime._retention import Retention
    from asyncio_ops._runtime._versions import write_version

    now = [1_800_000_000_000]
    monkeypatch.setattr(_leases, "_now_ms", lambda: now[0])
    s = CheckpointStorage(str(tmp_path), "op")
    for v in range(6):  # a full section every version: each version's chains name itself
        write_version(s, v, 0, 1, True, {1: _kg(1, f"f{v}")}, [], {}, writer=f"w{v}")
    lease = _leases.take(s, 1, 60)
    assert lease is not None and lease[1] == now[0] + 60_000
    forged = _leases.lease_name(0, now[0] + int(_leases.LONGEST * 1000) + 1)
    s.write_marker(forged)
    Retention(s, 5, 2, None).join()  # keeps 4 and 5, and 1 on for the lease
    assert s.versions() == [1, 2, 3, 4, 5]
    assert s.root_listing()[1] == [lease[0]]  # the forged one is gone
    now[0] += 59_000
    Retention(s, 5, 2, None).join()
    assert s.versions() == [1, 2, 3, 4, 5]
    now[0] += 1_000  # the lease has ended
    Retention(s, 5, 2, None).join()
    assert s.versions() == [4, 5] and s.root_listing()[1] == []
    assert "read_state's lease on these versions ended at" in _leases.lease_expired_note(lease[1])
    assert _leases.lease_expired_note(now[0] + 1) == ""


def test_a_reader_names_the_versions_deleted_before_it_could_lease_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``hold_versions`` leases what a read needs once it has pinned it; a version it
    needs that is gone by then (a retention that listed the leases before the reader's
    first) is a CheckpointError naming it, or, when the read asked for the newest
    version, one more pinning, logged. Nothing of the leases stays behind an error."""
    from asyncio_ops._runtime._leases import hold_versions
    from asyncio_ops._runtime._versions import write_version

    s = CheckpointStorage(str(tmp_path), "op")
    for v in range(3):
        write_version(s, v, 0, 1, True, {1: _kg(1, f"f{v}")}, [], {}, writer=f"w{v}")
    pinned: list[int] = []

    def pin() -> int:  # a retention deletes version 0 while the first pin reads manifests
        if not pinned:
            s.delete_versions([0])
        pinned.append(max(s.versions()))
        return pinned[-1]

    with pytest.raises(CheckpointError, match=r"no longer holds version\(s\) \[0\]"):
        hold_versions(s, 60, pin, lambda v: {0, v}, newest=False)
    assert s.root_listing()[1] == []
    pinned.clear()
    write_version(s, 0, 0, 1, True, {1: _kg(1, "f0")}, [], {}, writer="again")
    with caplog.at_level("WARNING", logger="asyncio_ops.runtime"):
        found, until = hold_versions(s, 60, pin, lambda v: {v}, newest=True)
    assert found == 2 and until is not None and caplog.text == ""  # nothing gone: no retry
    (lease,) = s.root_listing()[1]
    assert lease.startswith("lease-0000000002-")
    s.delete_marker(lease)
    calls: list[int] = []

    def needs(v: int) -> set[int]:  # the first pin needs a version deleted meanwhile
        calls.append(v)
        return {1, v} if len(calls) > 1 else {0, v}

    s.delete_versions([0])
    with caplog.at_level("WARNING", logger="asyncio_ops.runtime"):
        found, _ = hold_versions(s, 60, pin, needs, newest=True)
    assert found == 2 and "lost version(s) [0] while pinned" in caplog.text
    assert [n[:17] for n in s.root_listing()[1]] == ["lease-0000000001-"]


# -- signed files (a key in ASYNCIO_OPS_STATE_SIGNING_KEY) -----------------------------------


@pytest.fixture
def signing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCIO_OPS_STATE_SIGNING_KEY", "k-1")


def test_a_signed_file_round_trips_and_needs_the_key(
    tmp_path: Path, signing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "results-p0-a-0.ckpt", K, t(v=[1, 2]))
    assert s.read(1, "results-p0-a-0.ckpt", K).column("v").to_pylist() == [1, 2]
    monkeypatch.setenv("ASYNCIO_OPS_STATE_SIGNING_KEY", "another key")
    with pytest.raises(CorruptCheckpointError, match=r"results-p0-a-0\.ckpt: its signature"):
        s.read(1, "results-p0-a-0.ckpt", K)
    monkeypatch.delenv("ASYNCIO_OPS_STATE_SIGNING_KEY")
    with pytest.raises(CorruptCheckpointError, match=r"is signed; set ASYNCIO_OPS_STATE_SIGNING"):
        s.read(1, "results-p0-a-0.ckpt", K)


def test_a_forged_unsigned_replay_log_is_refused_while_a_key_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = CheckpointStorage(str(tmp_path), "op")
    s.write(1, "results-p0-a-0.ckpt", K, t(v=[666]))  # written without a key: a forgery
    monkeypatch.setenv("ASYNCIO_OPS_STATE_SIGNING_KEY", "k-1")
    with pytest.raises(CorruptCheckpointError, match=r"results-p0-a-0\.ckpt is not signed"):
        s.read(1, "results-p0-a-0.ckpt", K)


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
    kind = Kind.MANIFEST if name.startswith("subtask") else K
    CheckpointStorage(str(tmp_path), uid).write(version, name, kind, t(v=[3]))
    to = CheckpointStorage(str(tmp_path), target[0])
    to.write(target[1], target[2], K, t(v=[2]))
    data = bytearray((tmp_path / uid / f"v{version:010d}" / name).read_bytes())
    data[10:12] = struct.pack("<H", K)  # even with the header's kind changed to match
    (tmp_path / target[0] / f"v{target[1]:010d}" / target[2]).write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=rf"{re.escape(target[2])}: its signature"):
        to.read(target[1], target[2], K)


def test_a_signed_frame_read_by_its_range_verifies_alone(
    tmp_path: Path, signing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio_ops._storage._container as container

    monkeypatch.setattr(container, "_FRAME_BYTES", 1)  # a frame per section
    s = CheckpointStorage(str(tmp_path), "op")
    extents = s.write_sections(1, "kg-p00000-a.ckpt", Kind.KEY_GROUPS,
                               [_kg(3, "three"), _kg(9, "nine")])  # fmt: skip
    (sec,) = s.read_sections(1, "kg-p00000-a.ckpt", Kind.KEY_GROUPS, [extents[1][:2]])
    assert (sec.tag, sec.table.column("v").to_pylist()) == (9, ["nine"])
    path = tmp_path / "op" / "v0000000001" / "kg-p00000-a.ckpt"
    data = bytearray(path.read_bytes())
    offset, _, _ = extents[1]
    data[offset + _FRAME.size] ^= 0x01  # inside the frame's stored bytes
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"kg-p00000-a\.ckpt: its signature"):
        s.read_sections(1, "kg-p00000-a.ckpt", Kind.KEY_GROUPS, [extents[1][:2]])
    other = CheckpointStorage(str(tmp_path), "other")  # the same frame, another operator
    other.write_sections(1, "kg-p00000-a.ckpt", Kind.KEY_GROUPS, [_kg(3, "x")])
    moved = tmp_path / "other" / "v0000000001" / "kg-p00000-a.ckpt"
    moved.write_bytes(path.read_bytes()[:HEADER_SIZE] + bytes(data[extents[0][0] : offset]))
    with pytest.raises(CorruptCheckpointError, match=r"kg-p00000-a\.ckpt: its signature"):
        other.read_sections(1, "kg-p00000-a.ckpt", Kind.KEY_GROUPS)


def test_the_deltas_of_several_key_groups_are_one_section_each_chain_reads_its_own(
    tmp_path: Path,
) -> None:
    """keyed_process writes one SHARED delta section for all its key groups (sorted by
    key group, with it as a column): written once, each key group's link names the
    section's frame and the share of its bytes its rows are (what the full-snapshot rule
    sums), and a reader of any chain gets that key group's rows alone; a SHARED section
    not sorted by key group is an error naming the file."""
    import pyarrow as pa

    from asyncio_ops._runtime._versions import read_chains, write_version
    from asyncio_ops._storage._container import KEY_GROUP_FIELD, SHARED

    s = CheckpointStorage(str(tmp_path), "op")
    chains = write_version(s, 0, 0, 1, True, {1: _kg(1, "f1"), 2: _kg(2, "f2")}, [], {},
                           writer="a")  # fmt: skip
    rows = pa.table({"v": ["a", "b", "c"], KEY_GROUP_FIELD: pa.array([1, 2, 2], pa.int32())})
    shared = Section(SHARED, rows, DELTA)
    chains = write_version(s, 1, 0, 1, True, {1: shared, 2: shared}, [], {}, chains=chains,
                           writer="b")  # fmt: skip
    (_, _, offset1, length1, size1), (_, _, offset2, length2, size2) = (
        chains[1][1], chains[2][1]
    )  # fmt: skip
    assert (offset1, length1) == (offset2, length2)  # one section, one frame
    assert len(s.read_sections(1, chains[1][1][1], Kind.KEY_GROUPS)) == 1
    assert 0 < size1 < size2 and abs(size2 - 2 * size1) <= 1  # by rows: 1 and 2 of 3
    got = read_chains(s, chains)
    assert [sec.table.column("v").to_pylist() for _, sec in got[1]] == [["f1"], ["a"]]
    assert [sec.table.column("v").to_pylist() for _, sec in got[2]] == [["f2"], ["b", "c"]]
    assert got[2][1][1].table.schema.names == ["v"]
    # a chain's first delta carries the bytes of all its deltas (a manifest holds one
    # number per chain for them); a reader of a chain that extends a held one checks the
    # sections, not where the bytes are counted
    from asyncio_ops._runtime._versions import extends

    again = write_version(s, 2, 0, 1, True, {1: shared, 2: shared}, [], {}, chains=chains,
                          writer="d")  # fmt: skip
    assert [link[4] for link in again[1]] == [chains[1][0][4], 2 * size1, 0]
    assert extends(again[1], chains[1]) and not extends(chains[1], again[1])
    unsorted = Section(SHARED, rows.take([1, 0, 2]), DELTA)
    bad = write_version(s, 2, 0, 1, True, {1: unsorted, 2: unsorted}, [], {}, chains=chains,
                        writer="c")  # fmt: skip
    with pytest.raises(CorruptCheckpointError, match=r"kg-p00000-c-from0+\.ckpt: a section of "
                       r"several key groups not sorted by key group"):  # fmt: skip
        read_chains(s, bad)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["count", "seen", "ü"]),
            st.one_of(st.none(), st.binary(min_size=3, max_size=3)),
            st.one_of(st.none(), st.binary(max_size=4)),
            st.one_of(st.none(), st.text(max_size=3)),
            st.integers(0, 9),
            st.one_of(st.none(), st.lists(st.sampled_from(["kg-p0-a", "kg-p0-b"]), max_size=3)),
        ),
        max_size=40,
    )
)
def test_a_table_reads_back_as_written_whatever_its_columns_pack_into(
    rows: list[tuple[str, bytes | None, bytes | None, str | None, int, list[str] | None]],
) -> None:
    """Repeating strings and binaries are stored dictionary-encoded, binaries of one
    length as fixed-size with their bytes split into streams, lists of strings with their
    strings dictionary-encoded (formats 6 and 7): a reader gets every column back with
    the type, nullability and metadata it was written with, and the same values."""
    schema = pa.schema(
        [
            pa.field("state", pa.string(), nullable=False),
            pa.field("key", pa.binary(), metadata={b"aops.key_type": b"bigint"}),
            pa.field("value", pa.binary()),
            pa.field("name", pa.string()),
            pa.field("n", pa.int64(), nullable=False),
            pa.field("files", pa.list_(pa.field("item", pa.string(), nullable=False))),
        ],
        metadata={b"aops.kind": b"manifest"},
    )
    table = pa.Table.from_pylist(
        [dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema
    )
    data, _ = encode(K, [Section(0, table)])
    (back,) = decode(data, K, "some/file.ckpt")
    assert back.table.schema.equals(schema, check_metadata=True)
    assert back.table.to_pylist() == table.to_pylist()


def test_packed_columns_are_smaller_and_a_column_marked_packed_wrongly_is_named() -> None:
    keys = [b"i" + i.to_bytes(8, "little") for i in range(0, 2000, 7)]
    table = pa.table({
        "state": ["count"] * len(keys), "key": keys, "value": [b"\x80\x05K\x02."] * len(keys)
    })  # fmt: skip
    import asyncio_ops._storage._container as container

    packed = container._ipc(table)
    assert packed.size < 0.7 * table.nbytes
    assert [f.metadata[b"aops.packed"] for f in container._pack(table).schema] == [
        b"dictionary", b"fixed-split", b"dictionary",
    ]  # fmt: skip
    many = pa.table({"key": [b"i" + i.to_bytes(8, "little") for i in range(10_000)]})
    assert container._pack(many).schema.field("key").type == pa.binary(9)  # past the sample
    # the bytes split into streams: the first byte of every key, then the second, ...
    (stored,) = pa.ipc.open_stream(container._ipc(many.slice(0, 3))).read_all().columns
    first = stored.combine_chunks().buffers()[1].to_pybytes()[:12]
    assert first == b"iii" + bytes([0, 1, 2]) + bytes(6)
    split, _ = encode(K, [Section(0, many)])
    whole = pa.BufferOutputStream()
    with pa.ipc.new_stream(whole, pa.schema([("key", pa.binary(9))])) as writer:
        writer.write_table(many.cast(pa.schema([("key", pa.binary(9))])))
    unsplit, _ = encode(K, [Section(0, pa.ipc.open_stream(whole.getvalue()).read_all())])
    assert len(split) < 0.6 * len(unsplit)
    # a table of several chunks (record batches: the int column stays chunked, the packed
    # ones are written in its slices) reads back whole
    counted = table.append_column("n", pa.array(range(len(keys)), pa.int64()))
    chunked = pa.concat_tables([counted, counted.slice(5, 100), counted])
    (back,) = decode(encode(K, [Section(0, chunked)])[0], K, "some/file.ckpt")
    assert back.table.to_pylist() == chunked.to_pylist()
    lying = pa.table({"n": pa.array([1, 2], pa.int64())}).cast(
        pa.schema([pa.field("n", pa.int64(), metadata={b"aops.packed": b"fixed"})])
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, lying.schema) as writer:
        writer.write_table(lying)
    wrong = r"some/file\.ckpt verifies but .* column 'n' is int64, marked packed as"
    with pytest.raises(CorruptCheckpointError, match=wrong):
        decode(_contained(sink.getvalue().to_pybytes()), K, "some/file.ckpt",
               error=CorruptCheckpointError)  # fmt: skip


def test_a_container_of_format_6_is_read() -> None:
    """Format 6 stored a fixed-size binary column's values whole, one after the other."""
    keys = [b"i" + i.to_bytes(8, "little") for i in range(5)]
    field = pa.field("key", pa.binary(9), metadata={b"aops.packed": b"fixed"})
    stored = pa.table([pa.array(keys, pa.binary(9))], schema=pa.schema([field]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, stored.schema) as writer:
        writer.write_table(stored)
    (section,) = decode(_contained(sink.getvalue().to_pybytes(), version=6), K, "old.ckpt")
    assert section.table.equals(pa.table({"key": pa.array(keys, pa.binary())}))


def test_a_container_of_format_5_is_read() -> None:
    """Format 5 stored every column plain: its files read as they always did."""
    plain = t(s=["a", "a", "a"], b=[b"xy", b"xy", b"zz"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, plain.schema) as writer:
        writer.write_table(plain)
    (section,) = decode(_contained(sink.getvalue().to_pybytes(), version=5), K, "old.ckpt")
    assert section.table.equals(plain)


@pytest.fixture
def silent_store() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never answers."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    for s in held:
        s.close()
    server.close()


def test_an_object_store_that_never_answers_fails_at_its_request_timeout(
    silent_store: int,
) -> None:
    """The S3 filesystem the library makes has connect and request timeouts (10 s and 60 s
    by default; the location's query may set them): a store that accepts connections
    and never answers fails the request, naming the location, instead of holding a
    micro-batch for pyarrow's default of minutes."""
    import time

    location = (f"s3://k:s@bucket/state?endpoint_override=127.0.0.1:{silent_store}"
                "&scheme=http&region=us-east-1"
                "&request_timeout=0.5&connect_timeout=0.5")  # fmt: skip
    storage = CheckpointStorage(location, "op")
    options = storage.fs.__reduce__()[1][0]
    assert (options["connect_timeout"], options["request_timeout"]) == (0.5, 0.5)
    started = time.monotonic()
    with pytest.raises(CheckpointError, match="bucket/state"):
        storage.versions()
    # the client's few retries of a 0.5 s request, not pyarrow's default of minutes
    assert time.monotonic() - started < 60
    defaults = CheckpointStorage(location.split("&request_timeout")[0], "op")
    assert defaults.fs.__reduce__()[1][0]["request_timeout"] == 60.0
    with pytest.raises(CheckpointError, match="request_timeout must be a number of seconds"):
        CheckpointStorage(location.replace("request_timeout=0.5", "request_timeout=soon"), "op")
