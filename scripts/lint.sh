#!/usr/bin/env bash
# The lint and type gate (what .ci/run runs before the tests): ruff's rules, ruff's format and mypy on src/, as
# configured in pyproject.toml. Exits non-zero on any finding; `ruff format src && ruff check --fix src` fix most.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
status=0
"$PY" -m ruff check src || status=1
"$PY" -m ruff format --check src || status=1
"$PY" -m mypy || status=1  # files = ["src/gac"] in pyproject.toml
exit "$status"
