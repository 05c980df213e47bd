"""Fixtures of the fault-injection suite (the Spark session is the shared one)."""

from __future__ import annotations

from tests.spark.conftest import spark

__all__ = ["spark"]


# -- connector faults and security (test_connector_faults.py, test_security.py) --------------
# The real Postgres of the connector tests (ASYNCIO_OPS_PG_DSN or the local default; skipped
# when unreachable, failed under CI=true) with this session's uniquely named tables.
from collections.abc import Iterator
from pathlib import Path

import pytest
from asyncio_ops.connectors.postgres.testing import NoPostgres, ThrowawayPostgres

from tests.connectors.conftest import pg_dsn, pg_tables
from tests.helpers import unavailable

__all__ += ["pg_dsn", "pg_tables", "throwaway_pg"]


class RestartablePostgres(ThrowawayPostgres):
    """A throwaway cluster (never the machine's shared server) that a test may stop and start.

    ``kill()`` stops it the hard way (``pg_ctl -m immediate``: every backend dies at once,
    as in a crash) and keeps the data; ``revive()`` starts it again on the same port.
    """

    def _pg_ctl(self, *args: str) -> None:
        assert self.directory is not None
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.directory / "data"), *args)

    def kill(self) -> None:
        self._pg_ctl("-m", "immediate", "-w", "-t", "30", "stop")

    def revive(self) -> None:
        assert self.directory is not None
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories='{self.directory}' -c fsync=off"
        )
        log = str(self.directory / "server.log")
        self._pg_ctl("-l", log, "-o", options, "-w", "-t", "60", "start")

    def hba_prepend(self, line: str) -> None:
        """Put ``line`` first in pg_hba.conf (first match wins); reload with pg_reload_conf()."""
        assert self.directory is not None
        hba = Path(self.directory) / "data" / "pg_hba.conf"
        hba.write_text(line + "\n" + hba.read_text())


@pytest.fixture
def throwaway_pg() -> Iterator[RestartablePostgres]:
    """A private PostgreSQL on a free port (local server binaries), deleted afterwards.

    Skipped without the binaries; failed instead under CI=true.
    """
    try:
        server = RestartablePostgres()
        server.start()
    except NoPostgres as exc:
        reason = f"cannot start a throwaway PostgreSQL: {str(exc).splitlines()[0]}"
        unavailable(reason)
    try:
        yield server
    finally:
        server.stop()
