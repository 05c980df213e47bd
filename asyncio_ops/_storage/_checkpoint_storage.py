"""Checkpoint storage: versioned, verified Arrow files on any filesystem pyarrow.fs handles.

Layout under ``location`` (a local path or a URI: file://, hdfs://, s3://, gs://)::

    <uid>/v<version>/subtask-<i>.ckpt   manifest of partition i, written last: per key group
                                        its chain (files, offsets, lengths), element kind,
                                        input schema, watermark state
    <uid>/v<version>/ops-p<i>-<attempt>.ckpt
                                        operator state of partition i (the async operator,
                                        unkeyed): its in-flight elements
    <uid>/v<version>/kg-p<i>-<attempt>[-from<v>].ckpt
                                        partition i's key groups that changed, a section
                                        each: full, or a delta of some keys (keyed state
                                        and timers; see asyncio_ops._runtime._versions)
    <uid>/v<version>/results-p<i>-<token>-<seq>.ckpt
                                        completed lookups of a task attempt (replay log)
    <uid>/v<version>/fnstate-p<i>.ckpt  the function's own state (e.g. a lookup cache)
    <uid>/run-<id>/...                  the same files for one run of a batch job; the id
                                        starts with a sequence that orders the runs
    <uid>/lease-<from>-<until>-<id>     an empty file: a reader's lease on the versions
                                        from <from> on (asyncio_ops._runtime._leases)

Streaming queries use their micro-batch ids as versions; a batch job writes
one ``run-<id>`` directory per action (see ``docs/spark.md``).

Every file is one container (``asyncio_ops._storage._container``): a header naming
its kind, then typed Arrow tables as sections (a key-group file: one section
per key group, which the manifest locates by offset and length, so a
rescaled partition reads only the byte ranges of its key groups), each with
its CRC and, with a signing key in ``ASYNCIO_OPS_STATE_SIGNING_KEY``, an
HMAC-SHA256 over its bytes, the file's kind and its identity,
``<uid>/<version>/<name>`` (see ``asyncio_ops._storage._signing``): never pickle, so
loading a checkpoint never runs code. A file is written to a temporary name
and then moved into place, so a reader sees a whole file or none (on S3 and
GCS, where an object appears only once its upload completes, it is written
under its final name: no temporary name, no rename, no directory markers); a
torn, truncated, bit-flipped, too-new, other-kind or not-Arrow file raises
:class:`CorruptCheckpointError` naming it, never a silent loss. Files of
earlier formats (1: pickle payloads; 2 and 3: blobs inside files) are
refused by name.

On a remote filesystem, the key-group files a worker writes are also kept on
its local disk, and reads of them prefer those copies when they verify
(``asyncio_ops._storage._local_copies``).

Files hold the payloads of in-flight rows (whatever columns the input had):
protect the location as you would the input data. They are written with the
process umask.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs

from .._exceptions import CheckpointError, CorruptCheckpointError
from ._container import Frame, Kind, Section, encode, frame_sections, frames
from ._local_copies import LocalCopies, directory

_VERSION_DIR = re.compile(r"^v(\d{10})$")
_RUN_DIR: Final = "run-"
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
# <application start, ms>-<e|s><execution or stage id>-<DataFrame token>
_RUN_SEQUENCE = re.compile(r"^(\d{13})-[es](\d{10})-")
_OBJECT_STORES: Final = frozenset({"s3", "gcs"})  # pyarrow FileSystem.type_name
# A listing that races a directory being created is retried (see CheckpointStorage._entries).
_LIST_ATTEMPTS: Final = 5
# a file read from a remote store to be kept as a local copy is read whole up to this size,
# or if the ranges wanted are at least half of it (else only the ranges, and no copy)
_KEEP_WHOLE: Final = 8 << 20

log = logging.getLogger("asyncio_ops.runtime")

Version = int | str
"""A streaming version (the micro-batch id, or a pinned int) or a batch job's run id."""


_SECRET_PARAM = re.compile(r"key|secret|token|password|credential|signature", re.IGNORECASE)


def shown_location(location: str) -> str:
    """``location`` as messages show it: without credentials (a URI's user info, and
    query parameters such as ``access_key``, ``secret_key`` or ``session_token``)."""
    if "://" not in location:
        return location
    parts = urlsplit(location)
    host = parts.netloc.rpartition("@")[2]
    query = "&".join(
        pair for pair in parts.query.split("&")
        if pair and not _SECRET_PARAM.search(pair.partition("=")[0])
    )  # fmt: skip
    return urlunsplit((parts.scheme, host, parts.path, query, parts.fragment))


def _one_request_writes(location: str) -> str:
    """``location``, for S3, with ``allow_delayed_open=true`` unless it says otherwise: a
    small file is then one PUT, not a multipart upload's three requests (the open is
    checked at close, where :meth:`CheckpointStorage.write` raises naming the file)."""
    if not location.startswith("s3://") or "allow_delayed_open=" in location:
        return location
    return f"{location}{'&' if '?' in location else '?'}allow_delayed_open=true"


# the timeouts (seconds) of the S3 filesystem the library makes, as a location's query
# may set them: a store that accepts a connection and never answers fails the request
# (and, after the client's retries, the task) instead of holding it for minutes
S3_TIMEOUTS: Final = {"connect_timeout": 10.0, "request_timeout": 60.0}


def _without_timeouts(location: str) -> tuple[str, dict[str, float]]:
    """``location`` without its ``connect_timeout`` and ``request_timeout`` query
    parameters (pyarrow's URIs do not take them), and the timeouts to use: those
    given, else :data:`S3_TIMEOUTS`."""
    timeouts = dict(S3_TIMEOUTS)
    if not location.startswith("s3://") or "?" not in location:
        return location, timeouts
    base, _, query = location.partition("?")
    kept = []
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if name in timeouts:
            try:
                seconds = float(value)
            except ValueError:
                seconds = -1.0
            if not seconds > 0:
                raise CheckpointError(
                    f"checkpoint_location {shown_location(location)!r}: {name} must be a "
                    f"number of seconds > 0, got {value!r}"
                )
            timeouts[name] = seconds
        elif pair:
            kept.append(pair)
    return base + ("?" + "&".join(kept) if kept else ""), timeouts


def _with_timeouts(fs: pafs.FileSystem, timeouts: dict[str, float]) -> pafs.FileSystem:
    """An S3 filesystem as ``fs`` but for its connect and request timeouts."""
    rebuild, (options,) = fs.__reduce__()
    return rebuild({**options, **timeouts})


def check_run_id(run_id: str) -> str:
    """A batch run id is one path segment of letters, digits, ``_``, ``.`` and ``-``."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id) or run_id in (".", ".."):
        raise CheckpointError(f"checkpoint run id {run_id!r} is not a valid path segment")
    return run_id


def _verified(
    got: Sequence[bytes],
    ranges: Sequence[tuple[int, int]] | None,
    kind: Kind,
    where: str,
    identity: str,
) -> list[Frame]:
    """The verified frames of what a read got: a whole container (``ranges`` None), or
    one byte string per ``(offset, length)`` range, each whole frames."""
    if ranges is None:
        return frames(got[0], kind, where, identity, CorruptCheckpointError)
    out: list[Frame] = []
    for data, (offset, length) in zip(got, ranges, strict=True):
        if len(data) != length:
            raise CorruptCheckpointError(
                f"{where} is truncated: {len(data)} of {length} bytes at {offset}"
            )
        out += frames(data, kind, where, identity, CorruptCheckpointError, whole=False)
    return out


class CheckpointStorage:
    """Files of one operator (``uid``) under ``location``; see the module docstring."""

    def __init__(self, location: str, uid: str) -> None:
        self.location = location
        self.uid = uid
        uri, timeouts = _without_timeouts(location)
        try:
            fs, root = pafs.FileSystem.from_uri(_one_request_writes(uri))
        except (pa.ArrowInvalid, ValueError):
            fs, root = pafs.LocalFileSystem(), location
        if fs.type_name == "s3":
            fs = _with_timeouts(fs, timeouts)
        self.fs: pafs.FileSystem = fs
        self.root = f"{root.rstrip('/')}/{uid}"
        # objects appear whole once uploaded: no temporary name, no directories
        self.object_store = fs.type_name in _OBJECT_STORES
        # every request waits on a network: independent reads are worth making at once
        self.remote = fs.type_name != "local"
        # the key-group files this machine wrote, kept on its disk (_local_copies)
        found = directory() if self.remote else None
        self.local = (
            LocalCopies(found[0], f"{shown_location(location)}|{uid}", private=found[1])
            if found else None
        )  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "uid": self.uid}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"], state["uid"])  # type: ignore[misc]

    # -- paths -----------------------------------------------------------------------
    def version_dir(self, version: Version) -> str:
        if isinstance(version, str):
            return f"{self.root}/{_RUN_DIR}{check_run_id(version)}"
        return f"{self.root}/v{version:010d}"

    def path(self, version: Version, name: str) -> str:
        return f"{self.version_dir(version)}/{name}"

    def describe(self, path: str) -> str:
        """``path`` (under this storage's root) as messages show it: under the location
        as the user gave it, without credentials or query."""
        base = shown_location(self.location)
        if "://" in base:
            parts = urlsplit(base)
            base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        return f"{base.rstrip('/')}/{path[len(self.root) - len(self.uid) :]}"

    # -- writing ---------------------------------------------------------------------
    def check_writable(self) -> None:
        """Create the operator's directory and a probe file; raise naming the path if not."""
        probe = f"{self.root}/.probe-{uuid.uuid4().hex}"
        try:
            self.fs.create_dir(self.root, recursive=True)
            with self.fs.open_output_stream(probe) as out:
                out.write(b"ok")
            self.fs.delete_file(probe)
        except (OSError, pa.ArrowException) as exc:
            raise CheckpointError(
                f"checkpoint_location {shown_location(self.location)!r} is not writable: {exc}"
            ) from exc

    def write(
        self, version: Version, name: str, kind: Kind, table: pa.Table, thorough: bool = False
    ) -> None:
        """Atomically write ``table`` as ``<version dir>/<name>``, a container of ``kind``
        with one section (``thorough``: as :meth:`write_sections`)."""
        self.write_sections(version, name, kind, [Section(0, table)], thorough=thorough)

    def write_sections(
        self,
        version: Version,
        name: str,
        kind: Kind,
        sections: Iterable[Section],
        local: bool = False,
        thorough: bool = False,
    ) -> list[tuple[int, int, int]]:
        """Atomically write ``sections`` as ``<version dir>/<name>``, a container of
        ``kind``; returns each section's ``(offset, length)`` in the file (of its frame)
        and its own size (``asyncio_ops._storage._container.encode``, which takes the sections
        one at a time: a generator's are never all in memory). ``local``: keep a local
        copy too (an attempt-unique name; ``asyncio_ops._storage._local_copies``). ``thorough``:
        small frames compressed harder (a file many versions keep; ``encode``).

        On an object store (S3, GCS) the object is uploaded under its final name: it
        appears whole when its upload completes or not at all, and the store has no
        directories to create and no rename (a move there is a copy and a delete).
        Elsewhere it goes to a temporary name and is moved into place.
        """
        final = self.path(version, name)
        data, extents = encode(kind, sections, self.identity(version, name), thorough)
        try:
            if self.object_store:
                with self.fs.open_output_stream(final) as out:
                    out.write(data)
            else:
                tmp = f"{final}.tmp-{uuid.uuid4().hex}"
                self.fs.create_dir(self.version_dir(version), recursive=True)
                with self.fs.open_output_stream(tmp) as out:
                    out.write(data)
                self.fs.move(tmp, final)
        except (OSError, pa.ArrowException) as exc:
            raise CheckpointError(f"cannot write checkpoint file {final}: {exc}") from exc
        if local and self.local is not None:
            self.local.put(self._relative(version, name), data)
        return extents

    def _relative(self, version: Version, name: str) -> str:
        return f"{self.version_dir(version).rsplit('/', 1)[1]}/{name}"

    def keep_local_copies(self, prefix: str, named: Iterable[tuple[Version, str]]) -> None:
        """Delete the local copies of files starting with ``prefix`` other than the
        ``(version, name)`` in ``named`` (a partition's, after its manifest)."""
        if self.local is not None:
            self.local.keep_only(prefix, {self._relative(v, n) for v, n in named})

    # -- reading ---------------------------------------------------------------------
    def exists(self, version: Version, name: str) -> bool:
        info = self.fs.get_file_info(self.path(version, name))
        return bool(info.type == pafs.FileType.File)

    def read(self, version: Version, name: str, kind: Kind) -> pa.Table:
        """The one table of the file ``<version dir>/<name>``, a container of ``kind``."""
        sections = self.read_sections(version, name, kind)
        if len(sections) != 1:
            raise CorruptCheckpointError(
                f"checkpoint file {self.path(version, name)} holds {len(sections)} sections, not 1"
            )
        return sections[0].table

    def read_if_present(self, version: Version, name: str, kind: Kind) -> pa.Table | None:
        """:meth:`read`, or None if the file does not exist (one request fewer than
        asking first: on S3 a read is a HEAD and a GET, a listing one more)."""
        try:
            return self.read(version, name, kind)
        except CheckpointError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return None
            raise

    def read_sections(
        self,
        version: Version,
        name: str,
        kind: Kind,
        ranges: Sequence[tuple[int, int]] | None = None,
        local: bool = False,
        keep: bool = False,
    ) -> list[Section]:
        """The sections of ``<version dir>/<name>`` (a container of ``kind``), verified:
        all of them, or those in the byte ``ranges`` (``(offset, length)``, each covering
        whole sections: one ranged read each). ``local``: from its local copy if there
        is one that verifies (an attempt-unique name; ``asyncio_ops._storage._local_copies``);
        ``keep``: else read the file whole (unless it is much larger than the ranges)
        and keep it as the local copy."""
        where = f"checkpoint file {self.path(version, name)}"
        return [
            s
            for f in self.read_frames(version, name, kind, ranges, local, keep)
            for s in frame_sections(f, where, CorruptCheckpointError)
        ]

    def read_frames(
        self,
        version: Version,
        name: str,
        kind: Kind,
        ranges: Sequence[tuple[int, int]] | None = None,
        local: bool = False,
        keep: bool = False,
    ) -> list[Frame]:
        """:meth:`read_sections`, its frames checked (lengths, checksums, signatures) but
        not yet parsed (``asyncio_ops._storage._container.frame_sections`` parses one): what a
        reader that applies a frame at a time holds is the file's stored bytes."""
        path = self.path(version, name)
        where = f"checkpoint file {path}"
        identity = self.identity(version, name)
        if local and self.local is not None:
            copied = self._read_local_copy(version, name, kind, ranges, where, identity)
            if copied is not None:
                return copied
        try:
            if ranges is None:
                with self.fs.open_input_stream(path) as f:
                    return _verified([f.read()], None, kind, where, identity)
            with self.fs.open_input_file(path) as f:
                whole = None
                if keep and self.local is not None:
                    size = f.size()  # known: the file was opened with a HEAD
                    if size <= max(_KEEP_WHOLE, 2 * sum(n for _, n in ranges)):
                        whole = f.read_at(size, 0)
                got = [f.read_at(n, o) if whole is None else whole[o : o + n] for o, n in ranges]
            out = _verified(got, ranges, kind, where, identity)
            if whole is not None and self.local is not None:  # its ranges verified
                self.local.put(self._relative(version, name), whole)
            return out
        except FileNotFoundError as exc:
            raise CheckpointError(f"checkpoint file {path} is missing") from exc
        except (OSError, pa.ArrowException) as exc:
            raise CheckpointError(f"cannot read checkpoint file {path}: {exc}") from exc

    def _read_local_copy(
        self,
        version: Version,
        name: str,
        kind: Kind,
        ranges: Sequence[tuple[int, int]] | None,
        where: str,
        identity: str,
    ) -> list[Frame] | None:
        """:meth:`read_frames` from the local copy; None if there is none, or if it
        fails verification (then it is deleted)."""
        assert self.local is not None
        relative = self._relative(version, name)
        got = self.local.read(relative, ranges)
        if got is None:
            return None
        try:
            return _verified(got, ranges, kind, where, identity)
        except CorruptCheckpointError as exc:
            log.warning(
                "asyncio_ops: the local copy of %s failed verification (%s); reading "
                "the checkpoint's",
                where,
                exc,
            )
            self.local.drop(relative)
            return None

    def identity(self, version: Version, name: str) -> str:
        """What a signed file is signed as: ``<uid>/<version or run dir>/<name>``, so that
        a file copied to another operator, version or name does not verify."""
        return f"{self.uid}/{self.version_dir(version).rsplit('/', 1)[1]}/{name}"

    def _entries(self, directory: str) -> list[pafs.FileInfo]:
        """What ``directory`` holds; [] if it does not exist.

        Tasks of a batch start together, and one may list a directory while
        another creates it (its first write) or prunes it. pyarrow's
        ``allow_not_found`` lists first and checks existence after, so a
        directory created in between raises FileNotFoundError. Listing again
        then sees it (or, if pruned, nothing).
        """
        selector = pafs.FileSelector(directory, allow_not_found=True)
        try:
            for _ in range(_LIST_ATTEMPTS - 1):
                with contextlib.suppress(FileNotFoundError):
                    return list(self.fs.get_file_info(selector))
            return list(self.fs.get_file_info(selector))
        except OSError as exc:  # the store failed (a timeout, a refused connection)
            raise CheckpointError(
                f"cannot list checkpoint directory {self.describe(directory)}: {exc}"
            ) from exc

    def list_files(self, version: Version, prefix: str = "") -> list[str]:
        """Names of the complete files of ``version`` starting with ``prefix`` (sorted)."""
        names = []
        for info in self._entries(self.version_dir(version)):
            name = info.base_name
            if info.type == pafs.FileType.File and name.startswith(prefix) and ".tmp-" not in name:
                names.append(name)
        return sorted(names)

    def versions(self) -> list[int]:
        """The streaming (int) versions present, ascending."""
        return self.root_listing()[0]

    def root_listing(self) -> tuple[list[int], list[str]]:
        """From one listing of the operator's directory: the streaming versions present
        (ascending) and the names of the files beside them (sorted; e.g. the leases of
        ``asyncio_ops._runtime._leases``)."""
        found, files = [], []
        for info in self._entries(self.root):
            if info.type == pafs.FileType.File:
                files.append(info.base_name)
            elif (m := _VERSION_DIR.match(info.base_name)) and info.type == pafs.FileType.Directory:
                found.append(int(m.group(1)))
        return sorted(found), sorted(files)

    def write_marker(self, name: str) -> None:
        """Write the empty file ``<operator dir>/<name>``: its name is all it says."""
        path = f"{self.root}/{name}"
        try:
            if not self.object_store:
                self.fs.create_dir(self.root, recursive=True)
            with self.fs.open_output_stream(path) as out:
                out.write(b"")
        except (OSError, pa.ArrowException) as exc:
            raise CheckpointError(f"cannot write {self.describe(path)}: {exc}") from exc

    def delete_marker(self, name: str) -> None:
        """Delete ``<operator dir>/<name>`` if it is there."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(f"{self.root}/{name}")

    def other_uids(self) -> list[str]:
        """The other operators' ids under this location (its directories but this one's),
        sorted; one listing."""
        return sorted(
            info.base_name for info in self._entries(self.root[: -len(self.uid) - 1])
            if info.type == pafs.FileType.Directory and info.base_name != self.uid
            and not info.base_name.startswith(".")
        )  # fmt: skip

    def runs(self) -> list[str]:
        """Batch run ids present, oldest first: by the sequence their names start with
        (the application's start, then the execution id), never by modification time,
        which object stores do not keep for directories. Names without that sequence
        (written before it existed) count as older than every named run."""
        found: list[tuple[tuple[int, int, int, str], str]] = []
        for info in self._entries(self.root):
            name = info.base_name
            if name.startswith(_RUN_DIR) and info.type == pafs.FileType.Directory:
                run = name[len(_RUN_DIR) :]
                m = _RUN_SEQUENCE.match(run)
                key = (1, int(m.group(1)), int(m.group(2)), run) if m else (0, 0, 0, run)
                found.append((key, run))
        return [run for _, run in sorted(found)]

    def delete_file(self, version: Version, name: str) -> None:
        """Delete ``<version dir>/<name>`` if it is there (another task may have deleted
        its version first)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.path(version, name))

    def delete_versions(self, versions: Iterable[Version]) -> None:
        for v in versions:
            with contextlib.suppress(FileNotFoundError):  # another task deleted it first
                self.fs.delete_dir(self.version_dir(v))
