#!/usr/bin/env bash
# The hybrid MoE on the H200 device machine: kt-kernel's CPU experts next to the GPU.
# Carry .whlserve (scripts/gpu/fetch_serve_wheels.sh; its gguf wheel also serves kt-kernel's import) and .ktdev (scripts/gpu/fetch_kt_kernel.sh: kt-kernel
# 0.7.2's cp312 kt_kernel as one xz tarball, so both stay under the 64 MiB that reaches the GPU machine).
# Usage (device, repo root): bash scripts/gpu/hybrid_check.sh PART...
#   kt     kt-kernel MXFP4 experts at V4.1 shapes vs the read probe (scripts/bench/kt_experts.py)
#   layer  the gpu-marked hybrid layer tests (tests/hybrid/test_kt_moe_layer.py, test_hot_swap_streams.py)
#   live   the demo served hybrid (--gpu-experts 4, CUDA graphs) vs all-GPU (tests/hybrid/test_kt_hybrid_gpu_live.py)
#   moe    the Triton MXFP4 MoE GPU tests and benchmark (tests/ops/test_mxfp4_moe.py, scripts/bench/mxfp4_moe.py)
#   split  one full-width hybrid layer: GPU work, CPU work, wait (scripts/bench/hybrid_layer.py)
#   proxy  the full-width V4.1 proxy built, served hybrid, asked and timed (scripts/gpu/proxy_check.py)
#   plan   --vram-gib's plan next to what the GPU holds (tests/placement/test_vram_plan_gpu.py)
#   place  winport experts record, then --expert-placement from it (tests/hybrid/test_expert_placement_gpu_live.py)
#   ggufhot  hot experts swapped in from a GGUF served directly (tests/hybrid/test_hot_experts_gguf_gpu_live.py)
#   dspark DSpark with the hybrid MoE vs without speculation (tests/serve/test_dspark_live.py -k hybrid)
# T_<PART> sets each part's time limit in seconds; KT_THREADS, KT_ARGS, MOE_ARGS, SPLIT_ARGS and
# PROXY_ARGS pass options on.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/site
if [ -f .ktdev/kt_kernel.tar.xz ]; then tar -C /tmp/site -xJf .ktdev/kt_kernel.tar.xz  # scripts/gpu/fetch_kt_kernel.sh
elif [ -d .ktdev/kt_kernel ]; then cp -r .ktdev/kt_kernel .ktdev/kt_kernel.libs /tmp/site/; fi
# kt_kernel.utils.loader imports gguf at import time; a bare device python may lack it.
python3 -c "import gguf" 2>/dev/null || pip install -q --no-deps --target /tmp/site .whlserve/gguf-*.whl
ops_site() {  # a bare python on the device has no winport .pth: install the shim finder for it
  local site; site=$(mktemp -d); echo "import winport.shimloader as _s; _s.install()" > "$site/sitecustomize.py"
  echo "$site:/tmp/site:$PWD"
}
echo "cores $(nproc); $(grep -o -m1 'amx_[a-z0-9]*' /proc/cpuinfo | head -1); $(nvidia-smi --query-gpu=name --format=csv,noheader)"
for part in "$@"; do
  case $part in
  kt) echo "=== kt: CPU experts ==="
      # shellcheck disable=SC2086  # KT_ARGS is meant to split
      PYTHONPATH=/tmp/site:$PWD timeout "${T_KT:-240}" python3 scripts/bench/kt_experts.py \
        --threads "${KT_THREADS:-1,8,15}" ${KT_ARGS:-} --json "$OUT/kt_experts.json" > "$OUT/kt.log" 2>&1
      tail -20 "$OUT/kt.log" ;;
  layer) echo "=== layer: hybrid layer GPU tests ==="
      PYTHONPATH=$(ops_site) timeout "${T_LAYER:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider \
        tests/hybrid/test_kt_moe_layer.py tests/hybrid/test_hot_swap_streams.py > "$OUT/layer.log" 2>&1
      tail -25 "$OUT/layer.log" ;;
  live) echo "=== live: hybrid demo vs all-GPU ==="
      timeout "${T_LIVE:-420}" bash scripts/gpu/serve_demo.sh tests/hybrid/test_kt_hybrid_gpu_live.py -s \
        > "$OUT/live.log" 2>&1
      grep -v "^WARNING: Target" "$OUT/live.log" | tail -40 ;;
  moe) echo "=== moe: Triton MXFP4 MoE ==="
      PYTHONPATH=$(ops_site) timeout "${T_MOE_TESTS:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider \
        tests/ops/test_mxfp4_moe.py > "$OUT/moe_tests.log" 2>&1
      tail -15 "$OUT/moe_tests.log"
      # shellcheck disable=SC2086  # MOE_ARGS is meant to split
      PYTHONPATH=$(ops_site) timeout "${T_MOE_BENCH:-200}" python3 scripts/bench/mxfp4_moe.py ${MOE_ARGS:---check} \
        --json "$OUT/mxfp4_moe.json" > "$OUT/moe_bench.log" 2>&1
      tail -40 "$OUT/moe_bench.log" ;;
  split) echo "=== split: one full-width hybrid layer ==="
      # shellcheck disable=SC2086  # SPLIT_ARGS is meant to split
      PYTHONPATH=$(ops_site) timeout "${T_SPLIT:-300}" python3 scripts/bench/hybrid_layer.py ${SPLIT_ARGS:-} \
        --json "$OUT/hybrid_layer.json" > "$OUT/split.log" 2>&1
      grep -v "^WARNING: Target" "$OUT/split.log" | tail -25 ;;
  proxy) echo "=== proxy: full-width V4.1 proxy served hybrid ==="
      # shellcheck disable=SC2086  # PROXY_ARGS is meant to split
      timeout "${T_PROXY:-560}" bash scripts/gpu/serve_demo.sh --script scripts/gpu/proxy_check.py ${PROXY_ARGS:-} \
        > "$OUT/proxy.log" 2>&1
      grep -v "^WARNING: Target" "$OUT/proxy.log" | tail -25 ;;
  plan|place|ggufhot|dspark)
      case $part in
      plan) tests=(tests/placement/test_vram_plan_gpu.py) ;;
      place) tests=(tests/hybrid/test_expert_placement_gpu_live.py) ;;
      ggufhot) tests=(tests/hybrid/test_hot_experts_gguf_gpu_live.py) ;;
      dspark) tests=(tests/serve/test_dspark_live.py -k hybrid) ;;
      esac
      echo "=== $part: ${tests[*]} ==="
      limit_var="T_${part^^}"
      timeout "${!limit_var:-300}" bash scripts/gpu/serve_demo.sh "${tests[@]}" -s > "$OUT/$part.log" 2>&1
      echo "rc=$?"
      grep -v "^WARNING: Target" "$OUT/$part.log" | grep -v " INFO \|Warning\|warn(" | tail -30 ;;
  *) echo "unknown part $part"; exit 2 ;;
  esac
done
