"""Runnable examples of asyncio_ops (see docs/quickstart.md); helpers live in ``_pg`` and
``http_service``."""
