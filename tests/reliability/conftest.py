"""Fixtures of the fault-injection suite (the Spark session is the shared one)."""

from __future__ import annotations

from tests.spark.conftest import spark

__all__ = ["spark"]
