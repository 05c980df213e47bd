"""CPU seconds by role (Postgres, Spark's JVM, Spark's Python workers, the HTTP
lookup service) from ``/proc``.

A benchmark on a machine whose cores are all busy is a contest for CPU: where
Postgres, the JVM and the Python workers share two cores, the throughput of a
case is bounded by the CPU seconds it needs per row. :func:`snapshot` before
and after a case and :func:`usage` of the two give those seconds by role.

Linux only (elsewhere :func:`snapshot` is empty and so is every usage). A
process counts its own CPU and that of its children it has reaped (``cutime``,
``cstime``), so Postgres backends that ended during the case, counted by the
postmaster, are in. Processes of other users are read as well (``/proc/PID/stat``
is world-readable), so a local Postgres server the bench did not start counts
too; a remote one cannot be seen (its role is then absent).
"""

from __future__ import annotations

import os
from pathlib import Path

Snapshot = dict[int, tuple[str, float]]

ROLES = ("postgres", "spark jvm", "spark python", "http service")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cmdline(pid: int | str) -> str:
    """The command line of process ``pid`` (OSError if it is gone)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def _role(pid: str, comm: str) -> str | None:
    """The process's role; only a Python process's command line is read."""
    if comm.startswith("postgres"):
        return "postgres"
    if comm == "java":
        return "spark jvm"
    if comm.startswith("python"):
        line = cmdline(pid)
        if "pyspark.daemon" in line:
            return "spark python"
        if "asyncio_ops.services.customers" in line:
            return "http service"
    return None


def snapshot() -> Snapshot:
    """pid -> (role, CPU seconds so far) of every process with a role."""
    proc = Path("/proc")
    if not proc.is_dir():
        return {}
    out: Snapshot = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            role = _role(entry.name, stat[stat.index("(") + 1 : stat.rindex(")")])
        except OSError:  # ended meanwhile
            continue
        if role is None:
            continue
        # After "(comm) ": state is field 0; utime, stime, cutime, cstime are 11..14.
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
        out[int(entry.name)] = (role, ticks / _TICK)
    return out


def usage(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds by role between two snapshots (roles that used none are absent)."""
    used: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        earlier = before.get(pid)
        spent = seconds - (earlier[1] if earlier is not None and earlier[0] == role else 0.0)
        if spent > 0:
            used[role] = used.get(role, 0.0) + spent
    return used
