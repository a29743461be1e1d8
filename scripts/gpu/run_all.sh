#!/usr/bin/env bash
# Every gpu-marked test in tests/ops, then (with --bench) the three benchmarks, in one call on the
# GPU machine. A bare python there has no winport .pth, so a temporary sitecustomize installs the
# shim finder in every interpreter. Output also goes to $OUT/gpu_all.log when OUT is set.
set -u
SITE=$(mktemp -d)
echo "import winport.shimloader as _s; _s.install()" > "$SITE/sitecustomize.py"
export PYTHONPATH="$SITE:$PWD"
LOG=${OUT:-/tmp}/gpu_all.log
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  # test_dsv4_xpu compares against SGLang's own test references: SGLang is not installed on the GPU machine.
  python3 -m pytest -m gpu tests/ops -q -p no:cacheprovider -rs --ignore tests/ops/test_dsv4_xpu.py 2>&1 | tail -40
  if [ "${1:-}" = "--bench" ]; then
    python3 scripts/bench/ops.py
    python3 scripts/bench/attention.py
    python3 scripts/bench/gemm.py --no-prefill
  fi
} 2>&1 | tee "$LOG"
