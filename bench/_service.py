"""The example customer service (``examples/services/customers.py``) as a process of its
own, for the benchmarks that look customers up over HTTP.

:func:`start_service` runs it on a free port of 127.0.0.1 and returns once
``/healthz`` answers (30 s at most; a service that exits or never answers is an
error); :func:`stop_service` ends it. Its command line names
``asyncio_ops.services.customers``, which is how ``bench._cpu`` finds its CPU time.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(
    *, latency_ms: float, customers: int = 100_000, jitter_ms: float = 0.0,
    max_concurrent: int = 0, reject_above: int = 0, latency_after: str | None = None,
) -> tuple[subprocess.Popen[bytes], str]:  # fmt: skip
    """The running service and its base URL (``http://127.0.0.1:PORT``); the options are
    the service's own (``latency_after``: ``"SECONDS:MS"``)."""
    after = ["--latency-after", latency_after] if latency_after else []
    return start_process(
        "customers", "/healthz", "--latency-ms", str(latency_ms), "--jitter-ms",
        str(jitter_ms), "--customers", str(customers), "--max-concurrent",
        str(max_concurrent), "--reject-above", str(reject_above), *after,
    )  # fmt: skip


def start_process(service: str, ready: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m asyncio_ops.services.<service> --host 127.0.0.1 --port PORT *args`` and
    its base URL, once ``ready`` (a path) answers (30 s at most)."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", f"asyncio_ops.services.{service}", "--host", "127.0.0.1",
         "--port", str(port), *args],
        cwd=ROOT, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}{ready}", timeout=1):
                return proc, url
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                stop_service(proc)
                raise RuntimeError(f"the {service} service did not start") from None
            time.sleep(0.1)


def stop_service(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the service; kill it if it has not ended within 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
