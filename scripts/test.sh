#!/usr/bin/env bash
# Set up everything the tests need and run them: the venv with test tools, the Debian packages of the
# Wine/cross-compile tier (when running as root with apt), then pytest on every tier but gpu and slow.
# Extra arguments go to pytest. pytest's "no tests collected" (exit 5) counts as a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
touch .venv/.winport-installed
if [ -x scripts/ci/apt-test-tools.sh ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  bash scripts/ci/apt-test-tools.sh
fi
set +e
# --durations: the slowest tests, so that CI time can be watched (goal: under 60 minutes in all).
.venv/bin/python -m pytest -m "not gpu and not slow" --durations=25 "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
