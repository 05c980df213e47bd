"""The optional C accelerators, and the one switch that turns them off.

Two extensions are built at install when a C compiler is there (``setup.py``):
``asyncio_ops._slotsfast`` (the constructors of ``_construct``) and
``asyncio_ops.state._heapfast`` (the heap state backend's hot path). A module
that has one imports it, or None when it was not built, and asks
:func:`in_use` whether to use it: yes when it was built, unless the environment
sets ``ASYNCIO_OPS_PURE_PYTHON=1`` (read at every call, so that a test can run
both paths; the test suite does). Each fallback behaves the same, slower.
"""

from __future__ import annotations

import os
from typing import Final

PURE_PYTHON_ENV: Final = "ASYNCIO_OPS_PURE_PYTHON"


def in_use(extension: object | None) -> bool:
    """True if ``extension`` (a built C module, None if it was not built) is to be used."""
    return extension is not None and os.environ.get(PURE_PYTHON_ENV, "0") != "1"
