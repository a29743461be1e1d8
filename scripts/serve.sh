#!/usr/bin/env bash
# Set up .venv if needed, then run `winport serve` with the given arguments (e.g. --demo).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/winport ] || [ ! -f .venv/.winport-installed ]; then
  bash scripts/install.sh
  touch .venv/.winport-installed
fi
exec .venv/bin/winport serve "$@"
