"""Layer boundaries, read from the imports of every module (``ast``, nothing imported):
the core never imports pyspark, the runtime never the Spark layer, the state layer never
the engine (the operators and their runtime build on the state layer, not the reverse),
storage none of them; and every module stands on a floor (shared definitions, storage,
state, the engine, the runtime, the Spark API, the package's face: each a folder but the
first and the last) and imports only its own floor or below."""

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
        "asyncio_ops.spark",
        (
            "asyncio_ops._engine._wait_operator",
            "asyncio_ops._engine._keyed_operator",
            "asyncio_ops._engine._queues",
        ),
        "the Spark layer asks the runtime; it builds no operator and no queue",
    ),
    (
        "asyncio_ops.state",
        ("asyncio_ops._engine", "asyncio_ops._runtime", "asyncio_ops.spark"),
        "the state layer is below the engine",
    ),
    (
        "asyncio_ops._storage",
        ("asyncio_ops.state", "asyncio_ops._engine", "asyncio_ops._runtime", "asyncio_ops.spark"),
        "storage writes bytes; it knows no state, operator or runtime",
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
    found = dict((m, line) for line, m in imported(PACKAGE / "state" / "_keyed_snapshot.py"))
    assert "asyncio_ops._timers" in found and "asyncio_ops._storage._container.Section" in found


# -- the floors, bottom up: a module imports modules of its own floor or below, never above ----
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    (
        "shared definitions",
        (
            "asyncio_ops._exceptions", "asyncio_ops._elements", "asyncio_ops._clock",
            "asyncio_ops._timers", "asyncio_ops.async_retry_predicates", "asyncio_ops.options",
            "asyncio_ops._functions", "asyncio_ops._keygroups", "asyncio_ops._construct",
            "asyncio_ops._native", "asyncio_ops._slotsfast", "asyncio_ops.testing",
        ),
    ),
    ("storage", ("asyncio_ops._storage", "asyncio_ops._storage.*")),
    ("state", ("asyncio_ops.state", "asyncio_ops.state.*")),
    ("the engine", ("asyncio_ops._engine", "asyncio_ops._engine.*")),
    ("runtime", ("asyncio_ops._runtime", "asyncio_ops._runtime.*")),
    ("the Spark API", ("asyncio_ops.spark", "asyncio_ops.spark.*")),
    ("the package's face", ("asyncio_ops",)),
]  # fmt: skip


def floor_of(module: str) -> int:
    """The floor of ``module``: its exact name's, else its package's (``pkg.*``)."""
    for exact in (True, False):
        for i, (_, names) in enumerate(FLOORS):
            for n in names:
                if (module == n) if exact else (n.endswith(".*") and module.startswith(n[:-1])):
                    return i
    raise AssertionError(f"{module} is on no floor of tests/test_layers.py: place it")


def _module_of(name: str) -> str | None:
    """The module of the package an imported name lives in (None: outside the package)."""
    if not (name == "asyncio_ops" or name.startswith("asyncio_ops.")):
        return None
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        path = PACKAGE.parent.joinpath(*parts[:k])
        if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
            return ".".join(parts[:k])
        if any(path.parent.glob(path.name + ".*.so")):  # a compiled module (_heapfast)
            return ".".join(parts[:k])
    return None


def test_every_import_goes_to_the_same_floor_or_below() -> None:
    """Shared definitions, then storage, then the state layer, then the engine (both
    operators side by side, and their parts), then the runtime, then the Spark API; the
    package's ``__init__`` on top (docs/internals/layout.md). An
    ``from . import x`` counts as an import of ``x``, not of the package."""
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        mine = floor_of(name)
        seen: set[str] = set()
        for line, imported_name in imported(path):
            module = _module_of(imported_name)
            if module is None or module == name or module in seen:
                continue
            if module in ("asyncio_ops", "asyncio_ops.state") and any(
                _module_of(other) not in (None, module)
                for _, other in imported(path)
                if other.startswith(module + ".")
            ):
                continue  # ``from . import x``: the base of an import of its names
            seen.add(module)
            if floor_of(module) > mine:
                offences.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line}: {name} "
                    f"({FLOORS[mine][0]}) imports {module} ({FLOORS[floor_of(module)][0]})"
                )
    assert offences == [], "imports that run up a floor:\n" + "\n".join(offences)


def test_the_spark_layer_imports_the_faces_below_it_not_their_private_modules() -> None:
    """The Spark API reaches the runtime and the state layer through their faces
    (``asyncio_ops._runtime``, ``asyncio_ops.state``), never a private module behind
    them: what it needs of those is exported by the face, so a module can move
    behind it without the Spark layer noticing."""
    offences = []
    for path in sorted((PACKAGE / "spark").rglob("*.py")):
        for line, imported_name in imported(path):
            module = _module_of(imported_name)
            if module is None:
                continue
            for face in ("asyncio_ops._runtime.", "asyncio_ops.state."):
                if module.startswith(face) and module[len(face) :].startswith("_"):
                    offences.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {module}")
    assert offences == [], "the Spark layer behind a face:\n" + "\n".join(offences)


def test_every_module_imports_first(tmp_path: Path) -> None:
    """Each module imports in an interpreter that has imported nothing of the package yet
    (a circle the usual import order hides fails here: a Spark worker unpickling a user's
    function may import any module first). The interpreter writes the bytecode it compiles
    to a directory of this test's own and reads it back on the next import, so each
    module's source is compiled once, not once per module that imports it (under
    ``PYTHONDONTWRITEBYTECODE``, every time): the modules run again from scratch all the
    same."""
    import os
    import subprocess
    import sys

    names = [_module_name(p) for p in sorted(PACKAGE.rglob("*.py"))]
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] == 'asyncio_ops']:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        print(f'{name}: {type(exc).__name__}: {exc}')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=PACKAGE.parent, env=env, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == "", "modules that cannot be imported first:\n" + run.stdout


def test_a_module_over_600_lines_says_it_is_one_job() -> None:
    """No module of the package (connectors included) grows past 600 lines unless it is
    one class with one job (or one hierarchy of them) and its docstring says so: a long
    module doing several jobs is split instead."""
    long = []
    for root in (PACKAGE, PACKAGE.parent / "connectors"):
        for path in sorted(root.rglob("*.py")):
            text = path.read_text()
            if text.count("\n") <= 600:
                continue
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "one job" not in doc.lower():
                long.append(f"{path.relative_to(PACKAGE.parent)}: {text.count(chr(10))} lines")
    assert long == [], "modules over 600 lines that do not say their one job:\n" + "\n".join(long)
