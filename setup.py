"""Build hook for the optional C accelerator of the heap state backend.

Everything else is declared in pyproject.toml. ``optional=True``: without a C
compiler the install succeeds and the pure-Python classes in
``asyncio_ops/state/_heap.py`` are used instead (same behaviour, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "asyncio_ops.state._heapfast",
            ["asyncio_ops/state/_heapfast.c"],
            optional=True,
        )
    ]
)
