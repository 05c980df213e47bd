"""Runnable examples of asyncio_ops (see docs/quickstart.md); helpers live in ``_pg``
and ``_common``; the local services they call live in ``services`` (installed as
``asyncio_ops.services``)."""
