#!/usr/bin/env bash
# On the GPU machine (repo root): GPU tests of the FP8 GEMM / mHC / DSV4 JIT kernels, then the GEMM bench.
# Extra arguments go to the bench (e.g. --sweep).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
files=$(ls tests/ops/test_fp8_gemm*.py tests/ops/test_mhc*.py tests/ops/test_dsv4_jit*.py 2>/dev/null)
# shellcheck disable=SC2086  # the file list is meant to split
python3 -m pytest -m gpu $files -q -p no:cacheprovider 2>&1 | tail -30
python3 scripts/bench/gemm.py "$@"
