#!/usr/bin/env bash
# One device call, most important first: (1) the live server tests on CUDA as winport serves by
# default (decode without CUDA graphs), (2) the GPU op tests of the kernels changed since the last
# full GPU run, (3) the serving path with CUDA graphs on (WINPORT_CUDA_GRAPH=1), to check the
# graph-safe DSV4 shims. Each part has its own time limit; logs go to $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
echo "=== 1. live server tests, CUDA, eager decode ==="
timeout "${T1:-200}" bash scripts/gpu/serve_demo.sh tests/serve/test_server_live.py -s > "$OUT/1_live.log" 2>&1
grep -v "^WARNING: Target" "$OUT/1_live.log" | tail -"${TAIL1:-25}"
echo "=== 2. GPU op tests (routing, rope, softmax, bitmask, moe_align, scaled mm) ==="
if [ "${T2:-80}" != 0 ]; then
SITE=$(mktemp -d); echo "import winport.shimloader as _s; _s.install()" > "$SITE/sitecustomize.py"
PYTHONPATH="$SITE:$PWD" timeout "${T2:-80}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/ops/test_moe_routing.py \
  tests/ops/test_rotary.py tests/ops/test_sampling.py tests/ops/test_bitmask.py tests/ops/test_moe_align.py > "$OUT/2_ops.log" 2>&1
tail -8 "$OUT/2_ops.log"
fi
echo "=== 3. live server with CUDA graphs (WINPORT_CUDA_GRAPH=1) ==="
WINPORT_CUDA_GRAPH=1 timeout "${T3:-150}" bash scripts/gpu/serve_demo.sh tests/serve/test_server_live.py -s \
  -k "ready or test_chat_completion or prompt_logprobs or greedy" > "$OUT/3_graph.log" 2>&1
grep -v "^WARNING: Target" "$OUT/3_graph.log" | tail -30
