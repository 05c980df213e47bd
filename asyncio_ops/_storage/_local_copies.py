"""Local copies of the key-group files a worker wrote: Flink's task-local recovery.

Contract. With checkpoints on a remote filesystem (S3, GCS, HDFS: anything
but local disk), the key-group file a partition writes (``kg-p<i>-<token>``,
its keyed state: full sections and deltas) is also written to the worker
machine's local disk, byte for byte. A restore that reads a chain's file
reads the local copy when there is one, and the checkpoint otherwise: a
partition restored cold on the machine that wrote its versions (a new query,
another Python worker of the same executor, a task retried there) reads its
chains without a request to the store. A partition that reads its own
files (``kg-p<i>`` of its index) from the store, having moved to this
machine, reads them whole and keeps them too (a file over 8 MiB only if it
needs half of it), so it pays the store's requests once. The checkpoint stays
the only source of truth:

- only files named by a manifest read from the checkpoint are looked up, and
  their names are attempt-unique (never rewritten), so a copy holds exactly
  the file the manifest names or is not there;
- a copy is verified as the checkpoint's file is (each section's CRC, its
  signature with a signing key); one that fails is deleted and the file is
  read from the checkpoint;
- a copy that cannot be written (a full disk) is skipped and logged, never
  an error: the version was committed to the checkpoint.

Space: after writing version ``N``, a partition deletes its own copies
(``kg-p<i>-*``) that its manifest of ``N`` does not name, so the copies of a
partition are at most the files of its chains (about one full copy of its
state, compressed). Copies live under ``<dir>/<hash of location and uid>/``
where ``<dir>`` is ``ASYNCIO_OPS_LOCAL_COPIES`` if set (``0`` or ``off``
turns local copies off), else the first of Spark's local directories
(``SPARK_LOCAL_DIRS``, which Spark gives its Python workers and deletes with
the executor), else ``asyncio_ops-local-copies-<uid>`` in the system's
temporary directory, created readable by this user only (and not used if
another user owns it or may write to it). A partition that moves
to another machine reads its chains from the checkpoint there, as without
local copies.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import uuid
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Final

LOCAL_COPIES_ENV: Final = "ASYNCIO_OPS_LOCAL_COPIES"
_OFF: Final = frozenset({"0", "off", "false", "no"})
_SUBDIR: Final = "asyncio_ops-local-copies"

log = logging.getLogger("asyncio_ops.runtime")


def directory() -> tuple[Path, bool] | None:
    """Where local copies go in this process (module docstring), and whether it is the
    shared temporary directory's (checked private before first use); None if off."""
    raw = os.environ.get(LOCAL_COPIES_ENV, "").strip()
    if raw.lower() in _OFF:
        return None
    if raw:
        return Path(raw), False
    spark = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0].strip()
    if spark:  # the executor's own directory
        return Path(spark) / _SUBDIR, False
    return Path(tempfile.gettempdir()) / f"{_SUBDIR}-{os.getuid()}", True


def private_directory(path: Path, what: str, env: str) -> bool:
    """Whether ``path`` is (or, created readable by this user only, becomes) a directory
    this user owns that no one else may write (logged, naming ``what`` is off and the
    variable ``env`` that places it, if not): a shared temporary directory is no place
    for files a restore reads."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        log.warning("asyncio_ops: no %s: cannot create %s (%s)", what, path, exc)
        return False
    if (
        not path.is_dir()
        or path.is_symlink()
        or info.st_uid != os.getuid()
        or (info.st_mode & 0o022)
    ):
        log.warning(
            "asyncio_ops: no %s: %s is not a private directory of this user; set %s",
            what,
            path,
            env,
        )
        return False
    return True


class LocalCopies:
    """The local copies of one operator's checkpoint files (``where``: the location,
    without credentials, and the uid; hashed into a directory name). ``private``:
    ``base`` must prove a private directory of this user before the first copy is
    written or read (nothing is created before)."""

    def __init__(self, base: Path, where: str, private: bool = False) -> None:
        self.root = base / hashlib.sha256(where.encode()).hexdigest()[:20]
        self._warned = False
        self._base = base
        self._usable: bool | None = None if private else True  # None: not checked yet

    def _ready(self) -> bool:
        if self._usable is None:
            self._usable = private_directory(self._base, "local copies", LOCAL_COPIES_ENV)
        return self._usable

    def _file(self, relative: str) -> Path:
        return self.root / relative

    def put(self, relative: str, data: bytes | memoryview) -> None:
        """Keep ``data`` as the copy of ``relative`` (``<version dir>/<name>``): written to
        a temporary name and moved into place; on failure logged, not raised."""
        if not self._ready():
            return
        target = self._file(relative)
        tmp = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if not self._warned:  # once per process and operator: a full disk says it often
                self._warned = True
                log.warning(
                    "asyncio_ops: cannot keep a local copy of %s in %s (%s); "
                    "restores read it from the checkpoint",
                    relative,
                    self.root,
                    exc,
                )

    def read(self, relative: str, ranges: Sequence[tuple[int, int]] | None) -> list[bytes] | None:
        """The copy's bytes (whole, or each ``(offset, length)`` range), or None if there
        is no copy or it is shorter than a range asks."""
        if not self._ready():
            return None
        try:
            with open(self._file(relative), "rb") as f:
                if ranges is None:
                    return [f.read()]
                out = []
                for offset, length in ranges:
                    f.seek(offset)
                    data = f.read(length)
                    if len(data) != length:
                        return None
                    out.append(data)
                return out
        except OSError:  # none (or deleted while we looked): read the checkpoint's
            return None

    def drop(self, relative: str) -> None:
        """Delete the copy of ``relative`` (it failed verification)."""
        with contextlib.suppress(OSError):
            self._file(relative).unlink()

    def keep_only(self, prefix: str, named: Collection[str]) -> None:
        """Delete the copies whose name starts with ``prefix`` (a partition's files)
        other than those in ``named`` (``<version dir>/<name>``), and version
        directories left empty."""
        if not self._ready():
            return
        try:
            version_dirs = list(os.scandir(self.root))
        except OSError:
            return
        for entry in version_dirs:
            if not entry.is_dir():
                continue
            with contextlib.suppress(OSError):
                for file in os.scandir(entry.path):
                    if file.name.startswith(prefix) and (f"{entry.name}/{file.name}" not in named):
                        with contextlib.suppress(OSError):
                            os.unlink(file.path)
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)  # only if empty
