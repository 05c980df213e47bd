"""docker-compose.yml and the service's Dockerfile, checked without a Docker engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_postgres_service(compose: dict[str, Any]) -> None:
    pg = compose["services"]["postgres"]
    assert pg["image"].startswith("postgres:16")
    mounts = [v.split(":") for v in pg["volumes"]]
    init = [m for m in mounts if m[0] == "./examples/sql/init.sql"]
    assert init and init[0][1].startswith("/docker-entrypoint-initdb.d/")
    assert (ROOT / "examples" / "sql" / "init.sql").is_file()
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert "pgdata" in compose["volumes"]
    # the host port can move off 5432 (a local Postgres may hold it); 5432 by default
    assert pg["ports"] == ["127.0.0.1:${ASYNCIO_OPS_PG_PORT:-5432}:5432"]


def test_http_service_is_built_from_the_project(compose: dict[str, Any]) -> None:
    api = compose["services"]["customers-api"]
    context = ROOT / api["build"]["context"]
    dockerfile = (context / api["build"]["dockerfile"]).read_text()
    assert dockerfile.startswith("#") and "FROM python:3.11-slim" in dockerfile
    copied = [ln.split()[1] for ln in dockerfile.splitlines() if ln.startswith("COPY ")]
    assert copied and all((context / c).is_file() for c in copied)
    assert "aiohttp" in dockerfile
    assert api["environment"]["PORT"] == "8080"
    assert any(p.endswith(":8080") for p in api["ports"])
    assert "healthz" in " ".join(api["healthcheck"]["test"])


def test_redis_service(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert redis["image"].startswith("redis:7")
    assert redis["ports"] == ["127.0.0.1:${ASYNCIO_OPS_REDIS_PORT:-6379}:6379"]
    assert redis["command"][:3] == ["redis-server", "--save", ""]  # nothing on disk
    assert "ping" in redis["healthcheck"]["test"]
