#!/usr/bin/env bash
# Where does V4.1's decode part from its own prefill on CUDA? (scripts/bench/RESULTS.md, 2026-11-30:
# on the H200 16-23 of 32 greedy steps are prefill's argmax, worst 2.2 nat; on CPU 26-32, even with
# CUDA's FP8 activation rounding emulated.) One device call, eager decode, one server per line:
# the V4 demo for reference, V4.1 as shipped, then V4.1 with one CUDA-only choice of SGLang's or
# winport's turned off at a time. Each prints per-prompt exact steps and deficits.
# Usage (device, repo root, carry .whlserve): bash scripts/gpu/v41_bisect.sh [LABEL...]
#   no LABEL = all six (about 6 x 100 s: more than one device call allows, so split them, e.g.
#   `v4_demo v41 v41_no_fused_post_pre` then `v41_no_tilelang_mhc v41_no_deepgemm_prenorm v41_mxfp4_moe`).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
run() {  # label, then environment assignments; the serve arguments come from ARGS
  local label=$1; shift
  echo "=== $label ==="
  env WINPORT_CUDA_GRAPH=0 "$@" timeout "${T:-110}" bash scripts/gpu/serve_demo.sh --script \
    scripts/debug/v41_decode_vs_prefill.py ${ARGS:-} > "$OUT/bisect_${label}.log" 2>&1
  grep -E "^(ready|prompt)" "$OUT/bisect_${label}.log" | cut -c1-60 || tail -5 "$OUT/bisect_${label}.log"
}
LABELS=${*:-v4_demo v41 v41_no_fused_post_pre v41_no_tilelang_mhc v41_no_deepgemm_prenorm v41_mxfp4_moe}
for label in $LABELS; do
  case $label in
  v4_demo) ARGS="--demo-variant v4" run v4_demo ;;
  v41) run v41 ;;
  v41_no_fused_post_pre) run "$label" SGLANG_OPT_FUSE_MHC_POST_PRE=0 ;;
  v41_no_tilelang_mhc) run "$label" SGLANG_OPT_USE_TILELANG_MHC_PRE=0 SGLANG_OPT_USE_TILELANG_MHC_POST=0 ;;
  v41_no_deepgemm_prenorm) run "$label" SGLANG_OPT_DEEPGEMM_HC_PRENORM=0 ;;
  v41_mxfp4_moe) run "$label" WINPORT_GPU_MXFP4_MOE=1 ;;
  *) echo "unknown label $label"; exit 2 ;;
  esac
done
