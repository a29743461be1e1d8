#!/usr/bin/env bash
# Every gpu-marked test in tests/ops, then (with --bench, or --bench=ops,attn,gemm for some) the op,
# attention and GEMM benchmarks, in one
# call on the GPU machine. A bare python there has no winport .pth, so a temporary sitecustomize installs
# the shim finder in every interpreter. With .whlserve/ carried (scripts/gpu/fetch_serve_wheels.sh),
# SGLang is installed next to it and test_dsv4_xpu (which compares with SGLang's own references) runs
# too; without it that file is left out. Each step has its own time limit (T_TESTS, T_OPS, T_ATTN,
# T_GEMM seconds) so one hang cannot eat the device call. Output also goes to $OUT/gpu_all.log.
set -u
SITE=$(mktemp -d)
IGNORE="--ignore tests/ops/test_dsv4_xpu.py"
if ls .whlserve/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whlserve/*.whl \
    && IGNORE=""
fi
echo "import winport.shimloader as _s; _s.install()" > "$SITE/sitecustomize.py"
# As `winport serve` sets it (winport/serve/command.py): with it on, SGLang's CUDA import of the DSV4
# indexer pulls in deep_gemm.utils, which the port does not provide.
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1 SGLANG_ENABLE_JIT_DEEPGEMM=0
LOG=${OUT:-/tmp}/gpu_all.log
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  # shellcheck disable=SC2086  # IGNORE is meant to split
  timeout "${T_TESTS:-240}" python3 -m pytest -m gpu tests/ops -q -p no:cacheprovider -rs $IGNORE 2>&1 | tail -40
  case "${1:-}" in --bench) B=ops,attn,gemm ;; --bench=*) B=${1#--bench=} ;; *) B= ;; esac
  case ",$B," in *,ops,*) timeout "${T_OPS:-150}" python3 scripts/bench/ops.py ;; esac
  case ",$B," in *,attn,*) timeout "${T_ATTN:-150}" python3 scripts/bench/attention.py ;; esac
  case ",$B," in *,gemm,*) timeout "${T_GEMM:-200}" python3 scripts/bench/gemm.py ;; esac
} 2>&1 | tee "$LOG"
