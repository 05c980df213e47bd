"""One exception tree: the docstring of asyncio_ops._exceptions, its copy in docs/operator.md,
and the classes themselves agree."""

from __future__ import annotations

import builtins
import re
from pathlib import Path

import asyncio_ops
from asyncio_ops import _exceptions

ROOT = Path(__file__).resolve().parents[1]
_NODE = re.compile(r"^(?P<indent>[│ ]*(?:├── |└── )?)(?P<name>[A-Z]\w+)(?: \((?P<builtin>\w+)\))?")


def _tree(text: str) -> list[str]:
    """The lines of the tree: from the root's line to the last line of the block."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("AsyncOpsError"))
    out = []
    for line in lines[start:]:
        if not line.strip() or line.strip().startswith("```"):
            break
        out.append(line.strip("\n"))
    indent = len(out[0]) - len(out[0].lstrip())
    return [line[indent:].rstrip() for line in out]


def test_the_docs_copy_is_the_modules_tree() -> None:
    module_tree = _tree(_exceptions.__doc__ or "")
    docs_tree = _tree((ROOT / "docs" / "operator.md").read_text())
    assert docs_tree == module_tree


def test_every_class_has_the_parents_the_tree_draws() -> None:
    parents: list[tuple[int, str]] = []  # (depth, name) of the open branches
    seen = []
    for line in _tree(_exceptions.__doc__ or ""):
        m = _NODE.match(line)
        if m is None:
            continue  # a continuation line of a description
        depth = len(m.group("indent")) // 4
        name = m.group("name")
        cls = getattr(asyncio_ops, name)
        while parents and parents[-1][0] >= depth:
            parents.pop()
        if parents:
            assert issubclass(cls, getattr(asyncio_ops, parents[-1][1])), name
        builtin = m.group("builtin")
        if builtin:
            assert issubclass(cls, getattr(builtins, builtin)), name
        parents.append((depth, name))
        seen.append(name)
    defined = {
        n for n, v in vars(_exceptions).items()
        if isinstance(v, type) and issubclass(v, BaseException)
    }  # fmt: skip
    assert set(seen) == defined  # every exception of the module is in the tree, once


def test_a_message_is_clipped_to_its_beginning_and_end() -> None:
    from asyncio_ops._exceptions import MAX_MESSAGE

    error = asyncio_ops.ConfigurationError("head " + "v" * 10_000_000 + " tail")
    message = str(error)
    assert len(message) <= MAX_MESSAGE
    assert message.startswith("head vvv") and message.endswith("vvv tail")
    cut = int(message.split("[", 1)[1].split(" ", 1)[0])
    assert len(message) - len(f" ... [{cut} characters cut] ... ") + cut == 10_000_010
    assert str(asyncio_ops.ConfigurationError("short")) == "short"


def test_every_exception_goes_by_its_public_name() -> None:
    """Tracebacks, Spark's task errors and pickles name ``asyncio_ops.X`` (and
    ``asyncio_ops.connectors.X``), where users import them from, not the private module
    that defines them; a pickled error comes back as the same class."""
    import importlib
    import pickle
    import traceback

    from asyncio_ops.connectors import _exceptions as connector_exceptions

    from asyncio_ops import connectors

    for module, private in ((asyncio_ops, _exceptions), (connectors, connector_exceptions)):
        for name, cls in vars(private).items():
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                continue
            if cls is asyncio_ops.AsyncOpsError and private is connector_exceptions:
                continue  # imported there, defined in asyncio_ops
            assert cls.__module__ == module.__name__, name
            assert getattr(importlib.import_module(cls.__module__), name) is cls, name
    error = asyncio_ops.ConfigurationError("capacity must be > 0, got 0")
    assert traceback.format_exception_only(error) == [
        "asyncio_ops.ConfigurationError: capacity must be > 0, got 0\n"
    ]
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is asyncio_ops.ConfigurationError and str(again) == str(error)
    lookup = connectors.LookupQueryError("column 'id' missing")
    assert type(pickle.loads(pickle.dumps(lookup))) is connectors.LookupQueryError
    assert traceback.format_exception_only(lookup)[0].startswith(
        "asyncio_ops.connectors.LookupQueryError: "
    )
