"""Checkpoint storage: versioned, verified Arrow files on any filesystem pyarrow.fs handles.

Layout under ``location`` (a local path or a URI: file://, hdfs://, s3://, gs://)::

    <uid>/v<version>/subtask-<i>.ckpt   manifest of partition i, written last: per key group
                                        its chain of files, element kind, input schema
    <uid>/v<version>/ops-<i>.ckpt       operator state of partition i (sealed blob): watermark
                                        state, and its in-flight elements (unkeyed)
    <uid>/v<version>/kg-p<i>-<attempt>.ckpt
                                        partition i's key groups that changed, a row each:
                                        a full blob or a delta of some keys (keyed state
                                        and timers; see asyncio_ops._runtime._versions)
    <uid>/v<version>/results-p<i>-<token>-<seq>.ckpt
                                        completed lookups of a task attempt (replay log)
    <uid>/v<version>/fnstate-p<i>.ckpt  the function's own state (e.g. a lookup cache)
    <uid>/run-<id>/...                  the same files for one run of a batch job; the id
                                        starts with a sequence that orders the runs

Streaming queries use their micro-batch ids as versions; a batch job writes
one ``run-<id>`` directory per action (see ``docs/spark.md``).

Every file is ``MAGIC | format version (u16) | payload length (u64) | CRC32
(u32) | payload`` with an Arrow IPC stream as payload (its buffers compressed
with zstd, Arrow's own IPC compression) (and, with a signing key
in ``ASYNCIO_OPS_STATE_SIGNING_KEY``, format version 3: an HMAC-SHA256 after
the payload, over the file and its identity, ``<uid>/<version>/<name>``; see
``asyncio_ops._signing``): typed columns and
schema metadata, never pickle, so loading a checkpoint never runs code. A file
is written to a temporary name and then moved into place, so a reader sees a
whole file or none (on S3 and GCS, where an object appears only once its
upload completes, it is written under its final name: no temporary name, no
rename, no directory markers); a torn, truncated, bit-flipped, too-new or
not-Arrow file raises :class:`CorruptCheckpointError` naming it, never a silent
loss. Format version 1 (pickle payloads, asyncio_ops 0.1) is refused by name.

Files hold the payloads of in-flight rows (whatever columns the input had):
protect the location as you would the input data. They are written with the
process umask.
"""

from __future__ import annotations

import contextlib
import re
import struct
import uuid
import zlib
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs

from ._exceptions import CheckpointError, CorruptCheckpointError
from ._signing import MAC_SIZE, SIGNING_KEY_ENV, mac, signing_key, verifies

MAGIC: Final = b"AOPSCKP1"
FORMAT_VERSION: Final = 2
SIGNED_FORMAT_VERSION: Final = 3  # FORMAT_VERSION's frame, then an HMAC-SHA256
PICKLE_FORMAT_VERSION: Final = 1
_HEADER = struct.Struct("<8sHQI")
_VERSION_DIR = re.compile(r"^v(\d{10})$")
_RUN_DIR: Final = "run-"
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
# <application start, ms>-<e|s><execution or stage id>-<DataFrame token>
_RUN_SEQUENCE = re.compile(r"^(\d{13})-[es](\d{10})-")
_OBJECT_STORES: Final = frozenset({"s3", "gcs"})  # pyarrow FileSystem.type_name
# A listing that races a directory being created is retried (see CheckpointStorage._entries).
_LIST_ATTEMPTS: Final = 5

# Arrow IPC's own buffer compression (any pyarrow reads it): state blobs, pickled values
# and Arrow framing compress well (a running count's full state 16x, a delta 8x, at
# tens of milliseconds per 10 MB).
_WRITE_OPTIONS: Final = pa.ipc.IpcWriteOptions(
    compression="zstd" if pa.Codec.is_available("zstd") else None
)

Version = int | str
"""A streaming version (the micro-batch id, or a pinned int) or a batch job's run id."""


def encode(table: pa.Table, identity: str = "") -> bytes:
    """The bytes of one checkpoint file holding ``table`` (Arrow IPC stream, framed).

    With a signing key (``asyncio_ops._signing``) the file is signed over its bytes
    and ``identity`` (the operator's uid, the version or run, and the file's name,
    which says its kind and its partition or key group): format version 3, the
    signature after the payload.
    """
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_table(table)
    body: bytes = sink.getvalue().to_pybytes()
    key = signing_key()
    version = FORMAT_VERSION if key is None else SIGNED_FORMAT_VERSION
    framed = _HEADER.pack(MAGIC, version, len(body), zlib.crc32(body)) + body
    return framed if key is None else framed + mac(key, identity.encode(), framed)


def decode(data: bytes, name: str, identity: str = "") -> pa.Table:
    """Verify one checkpoint file and read its Arrow table; ``name`` is used in errors,
    ``identity`` is what a signed file must have been written as (see :func:`encode`)."""
    if len(data) < _HEADER.size:
        raise CorruptCheckpointError(
            f"checkpoint file {name} is truncated: {len(data)} bytes, shorter than its header"
        )
    magic, version, length, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptCheckpointError(f"checkpoint file {name} is not an asyncio_ops checkpoint")
    if version == PICKLE_FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"checkpoint file {name} has format version 1 (pickle, written by asyncio_ops 0.1); "
            "it is not loaded, since loading a pickle can run code: delete the checkpoint "
            "location (or use another) to start afresh"
        )
    if version > SIGNED_FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"checkpoint file {name} has format version {version}, newer than this asyncio_ops "
            f"reads ({SIGNED_FORMAT_VERSION}); upgrade asyncio_ops to restore it"
        )
    key = signing_key()
    if version == SIGNED_FORMAT_VERSION:
        if key is None:
            raise CorruptCheckpointError(
                f"checkpoint file {name} is signed; set {SIGNING_KEY_ENV} to the key that "
                "signed it"
            )
        view = memoryview(data)
        if len(data) < _HEADER.size + MAC_SIZE or not verifies(
            key, view[-MAC_SIZE:], identity.encode(), view[:-MAC_SIZE]
        ):
            raise CorruptCheckpointError(
                f"checkpoint file {name}: its signature does not verify: written with another "
                "key, for another operator, version, partition or file, or altered; it is not "
                "loaded"
            )
        data = data[:-MAC_SIZE]
    elif key is not None:
        raise CorruptCheckpointError(
            f"checkpoint file {name} is not signed and is not loaded while {SIGNING_KEY_ENV} "
            "is set"
        )
    body = data[_HEADER.size :]
    if len(body) != length:
        raise CorruptCheckpointError(
            f"checkpoint file {name} is truncated or torn: payload has {len(body)} bytes, "
            f"the header says {length}"
        )
    if zlib.crc32(body) != crc:
        raise CorruptCheckpointError(f"checkpoint file {name} fails its checksum (corrupted)")
    try:
        with pa.ipc.open_stream(pa.py_buffer(body)) as reader:
            table = reader.read_all()
        # Full validation (offsets within their buffers, ...): a crafted stream with a
        # valid checksum must be an error here, never a read outside memory later.
        table.validate(full=True)
        return table
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptCheckpointError(
            f"checkpoint file {name} verifies but is not a readable Arrow stream: {exc}"
        ) from exc


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


def check_run_id(run_id: str) -> str:
    """A batch run id is one path segment of letters, digits, ``_``, ``.`` and ``-``."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id) or run_id in (".", ".."):
        raise CheckpointError(f"checkpoint run id {run_id!r} is not a valid path segment")
    return run_id


class CheckpointStorage:
    """Files of one operator (``uid``) under ``location``; see the module docstring."""

    def __init__(self, location: str, uid: str) -> None:
        self.location = location
        self.uid = uid
        try:
            fs, root = pafs.FileSystem.from_uri(_one_request_writes(location))
        except (pa.ArrowInvalid, ValueError):
            fs, root = pafs.LocalFileSystem(), location
        self.fs: pafs.FileSystem = fs
        self.root = f"{root.rstrip('/')}/{uid}"
        # objects appear whole once uploaded: no temporary name, no directories
        self._object_store = fs.type_name in _OBJECT_STORES

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

    def write(self, version: Version, name: str, table: pa.Table) -> None:
        """Atomically write ``table`` as ``<version dir>/<name>``.

        On an object store (S3, GCS) the object is uploaded under its final name: it
        appears whole when its upload completes or not at all, and the store has no
        directories to create and no rename (a move there is a copy and a delete).
        Elsewhere it goes to a temporary name and is moved into place.
        """
        final = self.path(version, name)
        data = encode(table, self.identity(version, name))
        try:
            if self._object_store:
                with self.fs.open_output_stream(final) as out:
                    out.write(data)
                return
            tmp = f"{final}.tmp-{uuid.uuid4().hex}"
            self.fs.create_dir(self.version_dir(version), recursive=True)
            with self.fs.open_output_stream(tmp) as out:
                out.write(data)
            self.fs.move(tmp, final)
        except (OSError, pa.ArrowException) as exc:
            raise CheckpointError(f"cannot write checkpoint file {final}: {exc}") from exc

    # -- reading ---------------------------------------------------------------------
    def exists(self, version: Version, name: str) -> bool:
        info = self.fs.get_file_info(self.path(version, name))
        return bool(info.type == pafs.FileType.File)

    def read(self, version: Version, name: str) -> pa.Table:
        path = self.path(version, name)
        try:
            with self.fs.open_input_stream(path) as f:
                data = f.read()
        except FileNotFoundError as exc:
            raise CheckpointError(f"checkpoint file {path} is missing") from exc
        except (OSError, pa.ArrowException) as exc:
            raise CheckpointError(f"cannot read checkpoint file {path}: {exc}") from exc
        return decode(data, path, self.identity(version, name))

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
        for _ in range(_LIST_ATTEMPTS - 1):
            with contextlib.suppress(FileNotFoundError):
                return list(self.fs.get_file_info(selector))
        return list(self.fs.get_file_info(selector))

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
        found = []
        for info in self._entries(self.root):
            m = _VERSION_DIR.match(info.base_name)
            if m and info.type == pafs.FileType.Directory:
                found.append(int(m.group(1)))
        return sorted(found)

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

    def delete_versions(self, versions: Iterable[Version]) -> None:
        for v in versions:
            with contextlib.suppress(FileNotFoundError):  # another task deleted it first
                self.fs.delete_dir(self.version_dir(v))
