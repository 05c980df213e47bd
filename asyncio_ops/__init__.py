"""asyncio_ops: Flink's Async I/O for PySpark (facade; see DESIGN)."""
