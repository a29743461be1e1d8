#!/usr/bin/env bash
# On the GPU machine (repo root): GPU tests of sparse MLA + FP8 GEMM, then the decode sweeps of both
# benches (attention: batch 1/16/64 tile grid; GEMV: M=1 config grid). Logs go to $OUT when set.
# Each step has its own time limit so one hang cannot eat the whole device lease.
# Knobs (environment): TESTS (pytest files, "" = none), ATTN_ARGS ("" = skip the attention bench),
# GEMM_ARGS (arguments of scripts/bench/gemm.py, "" = skip it).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
TESTS=${TESTS-"tests/ops/test_sparse_mla.py tests/ops/test_fp8_gemm.py"}
ATTN_ARGS=${ATTN_ARGS-"--sweep --decode-only"}
GEMM_ARGS=${GEMM_ARGS-"--sweep --no-prefill"}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if [ -n "$TESTS" ]; then
  # shellcheck disable=SC2086  # the file list is meant to split
  timeout 260 python3 -m pytest -m gpu $TESTS -q -p no:cacheprovider 2>&1 | tail -15 | tee "$out/tests.txt"
fi
if [ -n "$ATTN_ARGS" ]; then
  # shellcheck disable=SC2086
  timeout 170 python3 scripts/bench/attention.py $ATTN_ARGS 2>&1 | tee "$out/attention.txt"
fi
if [ -n "$GEMM_ARGS" ]; then
  # shellcheck disable=SC2086
  timeout 240 python3 scripts/bench/gemm.py $GEMM_ARGS --json "$out/gemm.json" 2>&1 | tee "$out/gemm.txt"
fi
