#!/usr/bin/env bash
# Issue 3's GPU evidence: the gpu-marked op tests of the sgl_kernel/flashinfer/FA3 shims, then the
# op benchmark (arguments go to scripts/bench/ops.py: --sweep[=routing,softmax,bitmask], --sweep-only).
# Run from the repo root on the GPU machine (a bare python: no winport .pth there, so a temporary
# sitecustomize installs the shim finder in every interpreter, pytest's included). OPS_TESTS overrides
# the list of test files.
set -u
SITE=$(mktemp -d)
echo "import winport.shimloader as _s; _s.install()" > "$SITE/sitecustomize.py"
export PYTHONPATH="$SITE:$PWD"
FILES=${OPS_TESTS:-"tests/ops/test_norm.py tests/ops/test_activation.py tests/ops/test_rotary.py
tests/ops/test_moe_routing.py tests/ops/test_moe_align.py tests/ops/test_quant.py tests/ops/test_bitmask.py
tests/ops/test_merge_state.py tests/ops/test_sampling.py tests/ops/test_flash_attn.py"}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, sys.version.split()[0])"
python3 -m pytest -m gpu $FILES -q -p no:cacheprovider 2>&1 | tail -25
python3 scripts/bench/ops.py "$@"
