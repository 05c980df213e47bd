"""The engine: the two operators and their parts, on one asyncio event loop.

``_wait_operator/`` is the async operator (Flink's ``AsyncWaitOperator``) and
``_keyed_operator`` runs a ``KeyedProcessFunction`` (Flink's
``KeyedProcessOperator``), side by side; around them their parts: element
queues (``_queues``), timeout slots (``_timeout_slots``), retry strategies
(``_retry``), the adaptive in-flight limit (``_limit``), what the async operator
snapshots (``_operator_snapshot``), how an element's outcome is judged
(``_results``), statistics (``_statistics``) and a runner over finite input
(``_runner``). The engine stands on the state layer and the shared vocabulary,
and knows neither Arrow batches nor Spark (the runtime, above it, does). This
``__init__`` imports nothing: import the module you need.
"""
