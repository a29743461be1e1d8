#!/usr/bin/env bash
# Every gpu-marked test in tests/ops, then (with --bench, or --bench=ops,attn,gemm for some) the op,
# attention and GEMM benchmarks, in one call on the GPU machine. A bare python there has no winport
# .pth, so a temporary sitecustomize installs the shim finder in every interpreter. With .whlserve/ carried (scripts/gpu/fetch_serve_wheels.sh),
# SGLang is installed next to it and test_dsv4_xpu (which compares with SGLang's own references) runs
# too; without it that file is left out. Each step has its own time limit (T_TESTS, T_OPS, T_ATTN,
# T_GEMM seconds) so one hang cannot eat the device call; TESTS narrows the test files, ATTN_ARGS and
# GEMM_ARGS pass options to the attention and GEMM benchmarks. Output also goes to $OUT/gpu_all.log.
set -u
SITE=$(mktemp -d)
IGNORE="--ignore tests/ops/test_dsv4_xpu.py"
if ls .whlserve/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whlserve/*.whl \
    && IGNORE=""
fi
echo "import winport.shimloader as _s; _s.install()" > "$SITE/sitecustomize.py"
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
# SGLang's switches as `winport serve` sets them (winport/serve/command.py): without them SGLang's CUDA
# import of the DSV4 indexer pulls in deep_gemm.utils and flashinfer submodules the port does not have.
eval "$(python3 -c 'from winport.serve.command import sglang_switches as s
print("\n".join(f"export {k}={v}" for k, v in s("cuda").items()))')"
LOG=${OUT:-/tmp}/gpu_all.log
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  # shellcheck disable=SC2086  # IGNORE is meant to split
  # shellcheck disable=SC2086  # TESTS (default tests/ops: every op test file) is meant to split
  timeout "${T_TESTS:-240}" python3 -m pytest -m gpu ${TESTS:-tests/ops} -q -p no:cacheprovider -rs $IGNORE 2>&1 | tail -40
  case "${1:-}" in --bench) B=ops,attn,gemm ;; --bench=*) B=${1#--bench=} ;; *) B= ;; esac
  case ",$B," in *,ops,*) timeout "${T_OPS:-150}" python3 scripts/bench/ops.py ;; esac
  # shellcheck disable=SC2086  # ATTN_ARGS (e.g. --batches 1) is meant to split
  case ",$B," in *,attn,*) timeout "${T_ATTN:-150}" python3 scripts/bench/attention.py ${ATTN_ARGS:-} ;; esac
  # shellcheck disable=SC2086  # GEMM_ARGS (e.g. --no-prefill) is meant to split
  case ",$B," in *,gemm,*) timeout "${T_GEMM:-200}" python3 scripts/bench/gemm.py ${GEMM_ARGS:-} ;; esac
} 2>&1 | tee "$LOG"
