#!/usr/bin/env bash
# Set up .venv with everything the port needs (Linux). Arguments go to `python -m winport install`
# (--dev adds the test tools, --dry-run only prints). Idempotent: re-running reuses what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
# Look for Python outside an active venv: another checkout's venv would run that checkout's installer
# (its editable winport shadows this one) and set up that checkout instead of this one.
if [ -n "${VIRTUAL_ENV:-}" ]; then
  PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$VIRTUAL_ENV/bin" | paste -sd: -)
  unset VIRTUAL_ENV
fi
PY="${WINPORT_PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; raise SystemExit(sys.version_info[:2] != (3, 11))'; then
      PY="$cand"; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "install.sh: Python 3.11 not found (the torch wheels this port pins are cp311); set WINPORT_PYTHON" >&2
  exit 2
fi
exec "$PY" -m winport install "$@"
