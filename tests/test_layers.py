"""Layer boundaries, read from the imports of every module (``ast``, nothing imported):
the core never imports pyspark, the runtime never the Spark layer, the state layer never
the operator (the operator and its runtime build on the state layer, not the reverse)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "asyncio_ops"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import of ``path``, relative ones resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            out.append((node.lineno, module))
            out += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return out


RULES = [
    # (modules under, must not import, why)
    ("asyncio_ops", ("pyspark",), "only asyncio_ops.spark imports pyspark"),
    ("asyncio_ops._runtime", ("asyncio_ops.spark",), "the runtime knows pyarrow, not Spark"),
    (
        "asyncio_ops.state",
        (
            "asyncio_ops._operator",
            "asyncio_ops._queues",
            "asyncio_ops._timeout_slots",
            "asyncio_ops._runtime",
            "asyncio_ops.spark",
        ),
        "the state layer is below the operator",
    ),
]


@pytest.mark.parametrize(("under", "forbidden", "why"), RULES, ids=[r[0] for r in RULES])
def test_layer_boundaries(under: str, forbidden: tuple[str, ...], why: str) -> None:
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if not (name == under or name.startswith(under + ".")):
            continue
        if under == "asyncio_ops" and name.startswith("asyncio_ops.spark"):
            continue
        for line, module in imported(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                offences.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports {module}")
    assert offences == [], f"{why}:\n" + "\n".join(offences)


def test_the_resolver_sees_relative_imports() -> None:
    """The check itself: a relative import of the operator from the state layer is seen."""
    found = dict((m, line) for line, m in imported(PACKAGE / "state" / "_keyed_operator.py"))
    assert "asyncio_ops._timers" in found and "asyncio_ops._elements.Record" in found
