#!/usr/bin/env bash
# On the GPU machine (repo root): GPU tests of sparse MLA + FP8 GEMM, then the decode sweeps of both
# benches (attention: batch 1/16/64 tile grid; GEMV: M=1 config grid). Logs go to $OUT when set.
# Each step has its own time limit so one hang cannot eat the whole device lease.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 170 python3 -m pytest -m gpu tests/ops/test_sparse_mla.py tests/ops/test_fp8_gemm.py -q -p no:cacheprovider \
  2>&1 | tail -15 | tee "$out/tests.txt"
timeout 170 python3 scripts/bench/attention.py --sweep --decode-only "$@" 2>&1 | tee "$out/attention.txt"
timeout 150 python3 scripts/bench/gemm.py --sweep --no-prefill --json "$out/gemm.json" 2>&1 | tee "$out/gemm.txt"
