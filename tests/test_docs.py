"""Every code block of README.md and docs/ (``docs/**/*.md``, the internals included) runs,
so that the docs cannot drift from the code; every relative link resolves; the reference of
the public names is the docstrings' (``python -m scripts.reference``).

- ``python`` blocks run in order, one namespace per document, as a reader would
  paste them: top-level ``await`` is allowed, and every DataFrame a block defines
  is then computed (``count()``), so a lazy plan that would fail fails here. A
  document may use names its text assumes; :data:`GIVEN` supplies them (a
  ``dsn`` whose ``customers`` table is the demo's, ``orders_df``, ``people``, ...).
- ``python signature`` blocks show a constructor's signature: it must equal
  ``inspect.signature`` of the class, parameter for parameter.
- ``sql`` blocks run against the same database, with ``$1`` = ``[1, 2, 3]``.
- ``bash`` blocks are commands: each ``python examples/X.py``, ``python -m M``,
  ``pip install .[extra]`` and file argument must name what exists. The commands
  themselves run elsewhere: the install and the test command in ``.ci/run``, the
  demo in ``tests/examples``, the standalone recipe in ``tests/cluster``; the
  benchmarks are documented runs, and docker/YARN/Kubernetes need what this
  machine does not have.

Blocks without a language are output samples and diagrams, not code.

- Links ``[text](path#anchor)`` between the documents name a file that exists and, with an
  anchor, a heading of it, by GitHub's rules (lower case, punctuation but ``-`` and ``_``
  dropped, spaces as ``-``, ``-1``, ``-2`` for repeated headings).
- docs/reference.md is what ``scripts.reference`` generates from the public names'
  docstrings; every public class and function has a docstring with an example (``>>>``,
  run here as a doctest, or an ``Example::`` block, compiled here).
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import re
import shlex
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped,unused-ignore]
import pytest
from pyspark.sql import DataFrame, SparkSession

from examples import _pg
from tests.connectors.conftest import pg_dsn
from tests.connectors.support import pg_execute, run_isolated
from tests.spark.conftest import spark

__all__ = ["pg_dsn", "spark"]

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    info: str  # the fence's info string: "python", "python signature", "sql", "bash", ""
    code: str

    def __str__(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks(*infos: str) -> list[Block]:
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for m in FENCE.finditer(text):
            if m.group(1).strip() in infos:
                line = text.count("\n", 0, m.start()) + 1
                found.append(Block(document, line, m.group(1).strip(), m.group(2)))
    return found


def test_every_fenced_block_has_a_known_kind() -> None:
    """A new kind of block must be given a check here before it is used."""
    kinds = {b.info for b in blocks(*{m.group(1).strip() for d in DOCUMENTS
                                      for m in FENCE.finditer(d.read_text())})}  # fmt: skip
    assert kinds <= {"python", "python signature", "sql", "bash", ""}, kinds


# -- what the documents assume ------------------------------------------------------------------
@pytest.fixture(scope="module")
def docs_dsn(pg_dsn: str) -> Iterator[str]:
    """A DSN whose search path starts with a fresh schema holding the demo's customers."""
    schema = f"aops_docs_{uuid.uuid4().hex[:10]}"
    pg_execute(pg_dsn, f"CREATE SCHEMA {schema}; SET search_path = {schema}; "
               + _pg.seed_sql("customers", 1000))  # fmt: skip
    separator = "&" if "?" in pg_dsn else "?"
    try:
        yield f"{pg_dsn}{separator}search_path={schema}"
    finally:
        pg_execute(pg_dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def given(
    document: str, spark: SparkSession, dsn: str, request: pytest.FixtureRequest
) -> dict[str, Any]:
    """The names ``document`` uses without defining them."""
    orders = spark.range(0, 2000, numPartitions=2).selectExpr(
        "id AS order_id", "CAST(id % 1200 + 1 AS INT) AS customer_id"
    )

    async def lookup(row: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(0.001)
        return [{"name": f"customer-{row['customer_id']}", "tier": row["customer_id"] % 3}]

    names: dict[str, Any] = {"spark": spark, "dsn": dsn}
    if document == "docs/connectors.md":
        names["orders_df"] = orders
    elif document == "docs/spark.md":
        names["orders"] = orders
        names["lookup"] = lookup
        names["people"] = spark.createDataFrame([(1, "ada"), (2, "bob")], "id long, name string")
    elif document == "docs/keyed-state.md":
        names["events"] = spark.createDataFrame(
            [(1, 0.0), (1, 5.0), (2, 1.0)], "user_id long, t double"
        ).selectExpr("user_id", "timestamp_seconds(t) AS ts")
    elif document == "docs/cluster.md":  # a bucket: the S3-compatible server of the tests
        names["location"] = request.getfixturevalue("s3_server")(f"docs-{uuid.uuid4().hex[:8]}")
    return names


# -- python blocks ------------------------------------------------------------------------------
def _run(block: Block, namespace: dict[str, Any]) -> None:
    code = compile(block.code, str(block), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    before = {k: id(v) for k, v in namespace.items()}
    result = eval(code, namespace)
    if inspect.iscoroutine(result):  # a block with top-level await
        asyncio.run(result)
    for name, value in list(namespace.items()):
        if isinstance(value, DataFrame) and before.get(name) != id(value):
            try:
                value.count()
            except Exception as exc:
                raise AssertionError(f"{block}: computing {name} failed: {exc}") from exc


PYTHON_DOCS = sorted({str(b.document.relative_to(ROOT)) for b in blocks("python")})


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.parametrize("document", PYTHON_DOCS)
def test_python_blocks_run(
    document: str,
    spark: SparkSession,
    docs_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))  # `from examples... import` as from a clone
    namespace = given(document, spark, docs_dsn, request)
    for block in blocks("python"):
        if str(block.document.relative_to(ROOT)) == document:
            _run(block, namespace)
    assert SparkSession.getActiveSession() is not None  # no block stopped the shared session


# -- signatures ---------------------------------------------------------------------------------
def _documented_signature(code: str) -> tuple[str, inspect.Signature]:
    """``Name(a, b, *, c=1)`` as the signature of a function ``def _(a, b, *, c=1)``."""
    name, _, rest = code.strip().partition("(")
    tree = ast.parse(f"def _({rest.rstrip().removesuffix(')')}): pass")
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    namespace: dict[str, Any] = {}
    exec(compile(tree, name, "exec"), namespace)
    return name.strip(), inspect.signature(namespace["_"])


SIGNATURES = blocks("python signature")


@pytest.mark.parametrize("block", SIGNATURES, ids=[str(b) for b in SIGNATURES])
def test_documented_signatures_are_the_code(block: Block) -> None:
    from asyncio_ops.connectors.http import HttpLookup
    from asyncio_ops.connectors.postgres import PostgresLookup

    name, documented = _documented_signature(block.code)
    from asyncio_ops.connectors.redis import RedisLookup

    classes = {c.__name__: c for c in (PostgresLookup, HttpLookup, RedisLookup)}
    actual = inspect.signature(classes[name])
    doc = [(p.name, p.kind, p.default) for p in documented.parameters.values()]
    code = [(p.name, p.kind, p.default) for p in actual.parameters.values()]
    assert doc == code, f"{block}: the documented signature of {name} is not the code's"


# -- sql blocks ---------------------------------------------------------------------------------
SQL = blocks("sql")


@pytest.mark.postgres
@pytest.mark.parametrize("block", SQL, ids=[str(b) for b in SQL])
def test_sql_blocks_run(block: Block, docs_dsn: str) -> None:
    async def go() -> list[Any]:
        connection = await asyncpg.connect(docs_dsn, timeout=10)
        try:
            return list(await connection.fetch(block.code, [1, 2, 3], timeout=30))
        finally:
            await connection.close(timeout=5)

    assert run_isolated(go()), f"{block} returned no rows"


# -- bash blocks --------------------------------------------------------------------------------
def _commands(code: str) -> Iterator[list[str]]:
    """Each simple command of a shell block, as words (split at ``;``, ``&&``, ``|``)."""
    for line in code.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line)  # a comment: '#' starting a word
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = ""
        words: list[str] = []
        for token in lexer:
            if token and set(token) <= set(";&|()"):
                if words:
                    yield words
                words = []
            else:
                words.append(token)
        if words:
            yield words


BASH = blocks("bash")


@pytest.mark.parametrize("block", BASH, ids=[str(b) for b in BASH])
def test_bash_blocks_name_what_exists(block: Block) -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])  # fmt: skip
    checked = 0
    for words in _commands(block.code):
        words = [w for w in words if "=" not in w or w.startswith("-")]  # drop VAR=value
        if not words:
            continue
        if words[0] in ("python", "python3", "python3.11") and len(words) > 1:
            if words[1:3] == ["-m", "pytest"]:  # the test command: what CI runs
                assert "python -m pytest" in (ROOT / ".ci" / "run").read_text()
                checked += 1
            elif words[1] == "-m":
                assert importlib.util.find_spec(words[2]), f"{block}: no module {words[2]}"
                checked += 1
            elif words[1].endswith(".py"):
                assert (ROOT / words[1]).is_file(), f"{block}: no file {words[1]}"
                checked += 1
        if words[0] == "pip" and "install" in words:
            for w in words:
                m = re.fullmatch(r"\.?\[([a-z,]+)\]", w.strip("\"'").removeprefix("."))
                if m:
                    missing = set(m.group(1).split(",")) - extras
                    assert not missing, f"{block}: no extra(s) {sorted(missing)} in pyproject"
                    checked += 1
        if words[0].endswith("spark-submit"):
            script = next(w for w in words if w.endswith(".py"))
            assert script == "my_job.py" or (ROOT / script).is_file(), f"{block}: {script}"
            checked += 1
        if words[:2] == ["docker", "compose"]:
            assert (ROOT / "docker-compose.yml").is_file()
            checked += 1
        script = words[1] if words[0] == "bash" and len(words) > 1 else words[0]
        if script.startswith(("./", ".ci/")):  # a command of the repository's own
            assert (ROOT / script).is_file(), f"{block}: no file {script}"
            checked += 1
    assert checked or "venv-pack" in block.code or "spark-class" in block.code, (
        f"{block}: nothing checked"
    )


def test_the_metrics_table_is_the_summary() -> None:
    """docs/spark.md's metrics table defines every key of ``AsyncMetrics.summary()``,
    and no other."""
    from asyncio_ops._runtime import RunMetrics

    text = (ROOT / "docs" / "spark.md").read_text()
    table = text[text.index("| key | what it counts |") :].split("\n\n", 1)[0]
    documented = [
        name for line in table.splitlines()[2:]
        for name in re.findall(r"`([a-z0-9_]+)`", line.split("|")[1])
    ]  # fmt: skip
    assert documented == list(RunMetrics().summary())


# -- links --------------------------------------------------------------------------------------
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$", re.M)


def _prose(text: str) -> str:
    """``text`` without its fenced blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text in lower case, without punctuation but
    ``-`` and ``_``, spaces as ``-`` (``Columnar lookups (`chunk_size`)`` ->
    ``columnar-lookups-chunk_size``)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(document: Path) -> set[str]:
    seen: dict[str, int] = {}
    for m in HEADING.finditer(FENCE.sub("", document.read_text())):
        slug = github_anchor(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
    return {slug if n == 0 else f"{slug}-{n}" for slug, count in seen.items()
            for n in range(count)}  # fmt: skip


def test_the_anchor_rule_is_githubs() -> None:
    assert github_anchor("Columnar lookups (`chunk_size`)") == "columnar-lookups-chunk_size"
    assert github_anchor("Connectors (`bench/connectors.py`)") == "connectors-benchconnectorspy"
    assert github_anchor("Trust boundary, and signing") == "trust-boundary-and-signing"
    assert github_anchor("A — B") == "a--b"


def test_every_relative_link_resolves() -> None:
    """``[x](path#anchor)``: the file exists and, with an anchor, has that heading."""
    broken = []
    for document in DOCUMENTS:
        for target in LINK.findall(_prose(document.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (document.parent / path).resolve() if path else document
            where = f"{document.relative_to(ROOT)}: ({target})"
            if not linked.exists():
                broken.append(f"{where}: no file {path}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{where}: no heading '#{anchor}' in {linked.relative_to(ROOT)}")
    assert broken == []


# -- the reference, and examples in the docstrings ----------------------------------------------
def test_the_reference_is_the_docstrings() -> None:
    from scripts import reference

    assert (ROOT / "docs" / "reference.md").read_text() == reference.render(), (
        "docs/reference.md is out of date: python -m scripts.reference"
    )


EXAMPLE_BLOCK = re.compile(r"^Examples?\b[^\n]*::[ \t]*\n((?:[ \t]*\n|[ \t]+\S.*(?:\n|$))+)", re.M)


def _public() -> list[Any]:
    from scripts import reference

    seen: set[int] = set()
    out = []
    for entry in reference.entries():
        if entry.documented and id(entry.obj) not in seen:
            seen.add(id(entry.obj))
            out.append(entry)
    return out


def test_every_public_name_has_a_docstring_with_an_example() -> None:
    from scripts import reference

    missing = {
        f"{e.module}.{e.name}" for e in _public()
        if not (">>>" in (doc := reference.own_doc(e.obj)) or EXAMPLE_BLOCK.search(doc))
    }  # fmt: skip
    assert sorted(missing) == [], "no example in the docstring"


def test_docstring_examples_run() -> None:
    """``>>>`` examples run as doctests; ``Example::`` blocks (Spark jobs, network calls)
    compile."""
    import doctest

    from scripts import reference

    parser = doctest.DocTestParser()
    flags = doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.NORMALIZE_WHITESPACE
    failures = []
    for entry in _public():
        doc, name = reference.own_doc(entry.obj), f"{entry.module}.{entry.name}"
        if ">>>" in doc:
            test = parser.get_doctest(doc, {}, name, None, 0)
            runner = doctest.DocTestRunner(optionflags=flags)
            report: list[str] = []
            runner.run(test, out=report.append)
            if runner.failures:
                failures.append(f"{name}:\n" + "".join(report))
        for block in EXAMPLE_BLOCK.findall(doc):
            try:
                compile(inspect.cleandoc("\n" + block), name, "exec",
                        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)  # fmt: skip
            except SyntaxError as exc:
                failures.append(f"{name}: Example:: block does not compile: {exc}")
    assert failures == [], "\n".join(failures)
