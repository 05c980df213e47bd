# The environment the project's commands run in: sourced by ./demo and .ci/run.
#
# Names a missing Java or a Python below 3.11 before anything is installed; creates
# the virtual environment (ASYNCIO_OPS_VENV, default .venv) if it is missing, and
# installs the project into it (pip install -e ".[dev]") unless it already holds this
# checkout's install of the same pyproject.toml: a second run reuses it. Activates it.

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "asyncio_ops needs Python 3.11 or newer: no python3 on PATH" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "asyncio_ops needs Python 3.11 or newer; $PYTHON is $("$PYTHON" -V 2>&1)" \
       "(set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
if ! command -v java >/dev/null 2>&1; then
  echo "java not found: PySpark needs a JDK 17 (apt-get install openjdk-17-jre-headless)" >&2
  exit 1
fi

VENV="${ASYNCIO_OPS_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating the virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
stamp="$VENV/.asyncio_ops-install"
want="$(pwd) $(cat pyproject.toml setup.py | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== installing asyncio_ops and its dependencies into $VENV (a few minutes the first time)"
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet -e ".[dev]"
  echo "$want" > "$stamp"
else
  echo "== reusing $VENV (asyncio_ops is installed from this checkout)"
fi
