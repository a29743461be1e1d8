#!/usr/bin/env bash
# Provision the wine tier's Windows CPython 3.12 (embeddable, from PyPI) with win_amd64 wheels into
# .cache/wine/ (or $WINPORT_WINE_DIR), then optionally run the tier. The recipe and every Wine 8
# workaround live in tests/windows/wine_harness.py; this only orders the steps for CI and people.
#   bash scripts/ci/wine-python.sh          provision (cheap when cached) and print step timings
#   bash scripts/ci/wine-python.sh --test   ... then run `pytest -m wine tests/windows`
# Needs the venv (scripts/install.sh --dev: uv, pytest, tree-sitter) and Wine + mingw
# (scripts/ci/apt-test-tools.sh, run here when root and something is missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "wine-python.sh: $PY missing; run scripts/install.sh --dev" >&2; exit 2; }
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  bash scripts/ci/apt-test-tools.sh
fi
start=$(date +%s)
"$PY" -m tests.windows.wine_harness provision
echo "wine-python.sh: provisioned in $(( $(date +%s) - start )) s"
if [ "${1:-}" = "--test" ]; then
  shift
  exec "$PY" -m pytest -m wine tests/windows --durations=10 "$@"
fi
