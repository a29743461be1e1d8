#!/usr/bin/env bash
# Issue 5's GPU evidence: `winport serve --demo` on CUDA, run by the live server tests, on the H200
# device machine (which has torch/triton but neither SGLang nor its pure-Python dependencies and no
# network). The wheels travel in .whlserve/ (the repacked SGLang wheel from .cache/install/repacked
# plus the dependencies the device image lacks, fetched here with `pip download --python-version 3.12`).
# Usage (device, repo root): bash scripts/gpu/serve_demo.sh [pytest args...]
set -u
SITE=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whlserve/*.whl \
  || { echo "wheel install failed"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$SITE" . \
  || { echo "winport install failed"; exit 2; }
# --target installs skip .pth files; sitecustomize does what winport_shims.pth does in a venv, in
# every interpreter (pytest, `winport serve`, SGLang's spawned scheduler/detokenizer).
echo "import winport._bootstrap as _b; _b.activate()" > "$SITE/sitecustomize.py"
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
python3 -m winport doctor 2>&1 | tail -15
WINPORT_EMULATE_WINDOWS=1 python3 -c "import sglang.srt.entrypoints.engine, sglang.launch_server" || exit 3
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pytest -p no:cacheprovider -x -q "${@:-tests/serve/test_server_live.py}" 2>&1 | tee "$OUT/serve_demo.log"
