"""Build hook for the optional C accelerators: the heap state backend's hot path, and
the constructors of the objects built once per element (``asyncio_ops._construct``).

Everything else is declared in pyproject.toml. ``optional=True``: without a C
compiler the install succeeds and the pure-Python code in
``asyncio_ops/state/_heap.py`` and ``asyncio_ops/_construct.py`` is used instead
(same behaviour, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "asyncio_ops.state._heapfast",
            ["asyncio_ops/state/_heapfast.c"],
            optional=True,
        ),
        Extension(
            "asyncio_ops._slotsfast",
            ["asyncio_ops/_slotsfast.c"],
            optional=True,
        ),
    ]
)
