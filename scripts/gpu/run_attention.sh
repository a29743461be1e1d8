#!/usr/bin/env bash
# On the GPU machine (repo root): GPU tests of the DSV4 attention/indexer kernels, then the attention bench.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
python3 -m pytest -m gpu tests/ops/test_sparse_mla*.py tests/ops/test_indexer*.py tests/ops/test_dsv4_kv*.py \
  -q -p no:cacheprovider 2>&1 | tail -30
python3 scripts/bench/attention.py
