"""A throwaway PostgreSQL for tests and demos: :class:`ThrowawayPostgres`.

Starts a private cluster from the local PostgreSQL server binaries
(``initdb``/``pg_ctl`` on ``PATH``, else the newest
``/usr/lib/postgresql/*/bin``) in a temporary directory, on a free port of
127.0.0.1, with trust authentication, and deletes it when stopped, at
interpreter exit or on SIGTERM. As ``asyncpg.cluster.TempCluster`` does for
asyncpg's own tests, but documented, typed, and able to run as root (the
server then runs as the ``postgres`` system user, as PostgreSQL requires)::

    from asyncio_ops.connectors.postgres.testing import ThrowawayPostgres

    with ThrowawayPostgres() as server:
        lookup = PostgresLookup(server.dsn, "SELECT ... WHERE id = ANY($1)", key="id")

The project's demo starts one when no DSN is given; its fault tests subclass
it to kill and revive the server.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._exceptions import ConnectorError

__all__ = ["NoPostgres", "ThrowawayPostgres", "find_server_bin"]


class NoPostgres(ConnectorError):
    """No local PostgreSQL server binaries, or they failed to start a cluster."""


def find_server_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None.

    ``PATH`` first (resolving symlinks, so ``/usr/local/bin/pg_ctl -> .../15/bin``
    gives the real directory), then Debian's ``/usr/lib/postgresql/<major>/bin``,
    newest major first.
    """
    found = shutil.which("pg_ctl")
    if found:
        directory = Path(found).resolve().parent
        if (directory / "initdb").exists() and (directory / "postgres").exists():
            return directory
    candidates = []
    for d in glob.glob("/usr/lib/postgresql/*/bin"):
        major = Path(d).parent.name
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            try:
                candidates.append((float(major), Path(d)))
            except ValueError:
                continue
    if candidates:
        return max(candidates)[1]
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ThrowawayPostgres:
    """A private PostgreSQL cluster in a temporary directory, on a free local port.

    ``start()`` runs ``initdb`` (trust auth, superuser ``postgres``, no fsync)
    and ``pg_ctl start``, waits until it accepts connections and returns the
    DSN (``postgresql://postgres@127.0.0.1:PORT/postgres``). ``stop()`` stops
    the server (fast shutdown) and deletes the directory; it runs at
    interpreter exit and on SIGTERM too, and is idempotent.

    PostgreSQL refuses to run as root: as root, the server runs as the
    ``postgres`` system user (``run_as``), who owns the temporary directory.
    Nothing outside that directory is touched.
    """

    def __init__(self, bin_dir: Path | None = None, *, run_as: str = "postgres") -> None:
        found = bin_dir or find_server_bin()
        if found is None:
            raise NoPostgres(
                "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under "
                "/usr/lib/postgresql/*/bin: install them (apt-get install postgresql, or "
                "brew install postgresql)"
            )
        self.bin_dir = found
        self.run_as = run_as
        self.port = 0
        self.dsn = ""
        self.directory: Path | None = None
        self._user: tuple[int, int] | None = None

    # Popen keyword arguments that drop root to the server's user.
    def _as_server_user(self) -> dict[str, Any]:
        if self._user is None:
            return {}
        uid, gid = self._user
        return {"user": uid, "group": gid, "extra_groups": []}

    def _run(self, *args: str, timeout: float = 120) -> None:
        assert self.directory is not None
        result = subprocess.run(
            args,
            cwd=self.directory,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
            check=False,
            **self._as_server_user(),
        )
        if result.returncode != 0:
            log = self._log_tail()
            raise NoPostgres(
                f"{Path(args[0]).name} failed (exit {result.returncode}):\n"
                f"{result.stdout}{result.stderr}{log}"
            )

    def _log_tail(self) -> str:
        if self.directory is None:
            return ""
        log = self.directory / "server.log"
        try:
            lines = log.read_text(errors="replace").splitlines()[-20:]
        except OSError:
            return ""
        return "\nserver.log:\n" + "\n".join(lines)

    def start(self) -> str:
        if self.dsn:
            return self.dsn
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam(self.run_as)
            except KeyError:
                raise NoPostgres(
                    f"running as root, and PostgreSQL refuses root; no user {self.run_as!r} "
                    "to run it as. Create one (useradd postgres) or run as a normal user."
                ) from None
            self._user = (entry.pw_uid, entry.pw_gid)
        self.directory = Path(tempfile.mkdtemp(prefix="asyncio_ops_pg_"))
        atexit.register(self.stop)
        _stop_on_sigterm(self.stop)
        if self._user is not None:
            os.chown(self.directory, *self._user)
        data = self.directory / "data"
        self._run(
            str(self.bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        for attempt in range(3):
            # The port is free when chosen but could be taken before the server
            # binds it: try another one.
            self.port = _free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                f"-c unix_socket_directories='{self.directory}' "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                "-c max_connections=200 -c shared_buffers=256MB"
            )
            try:
                self._run(
                    str(self.bin_dir / "pg_ctl"), "-D", str(data), "-l",
                    str(self.directory / "server.log"), "-o", options, "-w", "-t", "60", "start",
                )  # fmt: skip
                break
            except NoPostgres:
                if attempt == 2:
                    self.stop()
                    raise
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        return self.dsn

    def stop(self) -> None:
        directory, self.directory = self.directory, None
        if directory is None:
            return
        data = directory / "data"
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [str(self.bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30",
                 "stop"],
                cwd=directory,
                capture_output=True,
                timeout=60,
                check=False,
                **self._as_server_user(),
            )  # fmt: skip
        shutil.rmtree(directory, ignore_errors=True)
        self.dsn = ""

    def __enter__(self) -> ThrowawayPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_sigterm_callbacks: list[Callable[[], None]] = []


def _stop_on_sigterm(callback: Callable[[], None]) -> None:
    """Run ``callback`` on SIGTERM too (atexit alone does not), then exit as SIGTERM would."""
    _sigterm_callbacks.append(callback)
    if len(_sigterm_callbacks) > 1:
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        for cb in reversed(_sigterm_callbacks):
            cb()
        if callable(previous):
            previous(signum, frame)
        sys.exit(128 + signum)

    with contextlib.suppress(ValueError):  # not the main thread: atexit still applies
        signal.signal(signal.SIGTERM, handler)
