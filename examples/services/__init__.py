"""Local stand-ins for the services the examples, tests and benchmarks call, installed
with the package as ``asyncio_ops.services`` (they need the ``http`` extra, aiohttp).

- :mod:`asyncio_ops.services.customers`: a customer lookup service over HTTP
  (``python -m asyncio_ops.services.customers --port 8080``);
- :mod:`asyncio_ops.services.models`: an OpenAI-compatible model service
  (``python -m asyncio_ops.services.models --port 8090``).

Each runs as a command from any directory, or in a program as a thread on a free port
of 127.0.0.1 (``ServiceThread``, ``OpenAIServiceThread``).
"""
