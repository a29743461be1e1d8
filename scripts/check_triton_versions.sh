#!/usr/bin/env bash
# Compile every recorded Triton specialization (tests/ops/triton_specializations.json) for cuda sm_90
# and sm_120 with Triton releases other than the venv's (CI compiles with the venv's own, 3.8): the
# kernels must build on Triton 3.6 through 3.9. Each release is installed once, without its
# dependencies, into .cache/triton-<version>/ (about 0.6-1 GB each) and put first on the path.
# Usage, from the repo root after scripts/install.sh --dev: bash scripts/check_triton_versions.sh [3.6.0 3.7.1 3.9.0 ...]
# Exit status: non-zero when any compile failed. triton-windows is not covered (Linux wheels only).
set -eu -o pipefail
PY=.venv/bin/python
status=0
for v in ${*:-3.6.0 3.7.1 3.9.0}; do
  dir=".cache/triton-$v"
  if [ ! -d "$dir/triton" ]; then
    "$PY" -m pip install -q --no-deps --target "$dir" "triton==$v"
  fi
  echo "== Triton $v ($dir)"
  got=$(PYTHONPATH="$dir" "$PY" -c 'import triton; print(triton.__version__)')
  if [ "$got" != "$v" ]; then
    echo "expected Triton $v on the path, found $got" >&2
    exit 2
  fi
  if ! PYTHONPATH="$dir:$PWD" "$PY" -m tests.ops.triton_specializations compile --arch 90 120 \
      --procs "${PROCS:-2}" | tail -n 3; then
    status=1
  fi
done
exit $status
