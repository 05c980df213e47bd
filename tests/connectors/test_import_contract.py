"""The connectors' import contract: installed as ``asyncio_ops.connectors`` (never a
top-level ``connectors``), built on asyncio_ops' public API only, and every package of the
repository in the distribution."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONNECTORS = ROOT / "connectors"


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute import of a file (relative ones skipped)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def test_connectors_use_only_the_public_api_of_asyncio_ops() -> None:
    """Connectors import what the package's face (``asyncio_ops``, and its options)
    exports: never a private module, nor a subpackage of the engine (``asyncio_ops.state``)
    or their own package by its installed name."""
    offences = []
    for path in sorted(CONNECTORS.rglob("*.py")):
        where = path.relative_to(ROOT)
        for line, module, names in _imports(path):
            top = module.split(".")[0]
            if top == "connectors":
                offences.append(f"{where}:{line}: imports the top-level {module!r}")
            if top != "asyncio_ops":
                continue
            parts = module.split(".")[1:] + names
            private = [p for p in parts if p.startswith("_") and p != "__future__"]
            # the package's face (and its options), not the engine's subpackages
            face = module in ("asyncio_ops", "asyncio_ops.options")
            if private or not face:
                offences.append(f"{where}:{line}: from {module} import {', '.join(names)}")
    assert offences == [], "\n".join(offences)


def test_every_package_of_the_repository_is_in_the_distribution() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    found = (
        {
            ".".join(p.parent.relative_to(ROOT).parts)
            for p in (ROOT / "asyncio_ops").rglob("__init__.py")
        }
        | {
            ".".join(("asyncio_ops", *p.parent.relative_to(ROOT).parts))
            for p in CONNECTORS.rglob("__init__.py")
        }
        | {
            ".".join(("asyncio_ops", *p.parent.relative_to(ROOT / "examples").parts))
            for p in (ROOT / "examples" / "services").rglob("__init__.py")
        }
    )
    assert declared == found
    assert config["package-dir"] == {
        "asyncio_ops.connectors": "connectors",
        "asyncio_ops.services": "examples/services",
    }


def test_installed_as_asyncio_ops_connectors_and_not_as_connectors(tmp_path: Path) -> None:
    """Outside the repository (no checkout on sys.path) only the installed name exists."""
    code = (
        "import importlib.util, asyncio_ops.connectors.postgres, asyncio_ops.connectors.http\n"
        "print(importlib.util.find_spec('connectors') is None)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"
