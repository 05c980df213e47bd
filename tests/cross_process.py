"""Helpers for test functions that run in Spark's Python workers (other processes):
state that must be seen across processes and attempts lives in files."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path


def log_request(path: str, row_id: int) -> None:
    """Append ``row_id`` to the request log at ``path`` (atomic line append)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{row_id}\n".encode())
    finally:
        os.close(fd)


def requests(path: Path) -> Counter[int]:
    """How often each row was requested, from the log."""
    return Counter(int(line) for line in path.read_text().split())


def first_time(marker_dir: str, row_id: int) -> bool:
    """True the first time any process asks for ``row_id`` (a marker file remembers)."""
    marker = Path(marker_dir) / str(row_id)
    if marker.exists():
        return False
    marker.touch()
    return True


def first_attempt() -> bool:
    """Inside a Spark task: is this the task's first attempt?"""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx is not None and ctx.attemptNumber() == 0
