#!/usr/bin/env bash
# Lints the Python client (client/python/temb) and the test helpers
# (tests/pylib): ruff (ruff.toml) and mypy (mypy.ini), both pinned in
# scripts/requirements-dev.txt.  PYTHON (default .venv/bin/python) is the
# interpreter that has them.  The client's gRPC stubs (temb._proto) are
# generated first where missing or stale, as the Python tests do, so that
# mypy checks the calls against them.  Prints every finding of both tools;
# exit 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
PATHS=(client/python/temb tests/pylib)

"$PYTHON" -c 'import sys; sys.path.insert(0, "tests/pylib")
import temb_testing; temb_testing.generate_client_stubs()'

bad=0
echo "lint-python: $("$PYTHON" -m ruff --version)"
"$PYTHON" -m ruff check --no-fix "${PATHS[@]}" || bad=1
echo "lint-python: $("$PYTHON" -m mypy --version)"
# mypy.ini names the files.
"$PYTHON" -m mypy || bad=1
if ((bad)); then
  echo "lint-python: findings above (ruff.toml, mypy.ini)"
fi
exit "$bad"
