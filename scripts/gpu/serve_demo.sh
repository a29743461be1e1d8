#!/usr/bin/env bash
# Issue 5's GPU evidence: `winport serve --demo` on CUDA, run by the live server tests, on the H200
# device machine (which has torch/triton but neither SGLang nor its pure-Python dependencies and no
# network). The wheels travel in .whlserve/ (the repacked SGLang wheel from .cache/install/repacked
# plus the dependencies the device image lacks: scripts/gpu/fetch_serve_wheels.sh fills it).
# Usage (device, repo root): bash scripts/gpu/serve_demo.sh [pytest args...]
#        bash scripts/gpu/serve_demo.sh --probe [serve args...]   (list the CUDA JIT kernels SGLang still
#        asks for: scripts/gpu/jit_probe.py; start `winport serve --demo [serve args]`, send one request,
#        print the list; e.g. --probe --demo-variant v41 --speculative-algorithm DSPARK)
#        bash scripts/gpu/serve_demo.sh --script FILE [args...]   (run a Python script in the same setup)
set -u
SITE=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whlserve/*.whl \
  || { echo "wheel install failed"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target "$SITE" . \
  || { echo "winport install failed"; exit 2; }
# --target installs skip .pth files; sitecustomize does what winport_shims.pth does in a venv, in
# every interpreter (pytest, `winport serve`, SGLang's spawned scheduler/detokenizer).
printf 'import winport._bootstrap as _b\n_b.activate()\nimport os, sys\nif os.environ.get("WINPORT_JIT_PROBE_FILE"):\n    sys.path.insert(0, os.environ["WINPORT_REPO"] + "/scripts/gpu")\n    import jit_probe  # noqa: F401\n' > "$SITE/sitecustomize.py"
export WINPORT_REPO="$PWD" WINPORT_TEST_SERVER_LOG_DIR="${OUT:-/tmp/out}/servers"
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
python3 -m winport doctor 2>&1 | tail -15
WINPORT_EMULATE_WINDOWS=1 SGLANG_ENABLE_JIT_DEEPGEMM=0 SGLANG_IS_FLASHINFER_AVAILABLE=false python3 -c "import sglang.srt.entrypoints.engine, sglang.launch_server" || exit 3
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ "${1:-}" = "--probe" ]; then
  export WINPORT_JIT_PROBE_FILE="$OUT/jit_probe.txt" WINPORT_EMULATE_WINDOWS=1 WINPORT_CACHE=/tmp/wpcache
  shift
  python3 -m winport serve --demo --port 30123 "$@" > "$OUT/probe_server.log" 2>&1 &
  SRV=$!
  for _ in $(seq 300); do grep -q "ready at" "$OUT/probe_server.log" && break; kill -0 $SRV 2>/dev/null || break; sleep 1; done
  curl -s -m 60 http://127.0.0.1:30123/generate -H 'Content-Type: application/json' \
    -d '{"text":"hello there","sampling_params":{"max_new_tokens":8,"temperature":0}}'; echo
  kill -INT $SRV; sleep 5
  tail -25 "$OUT/probe_server.log"; echo "== JIT modules asked for =="; cat "$OUT/jit_probe.txt"
  exit 0
fi
if [ "${1:-}" = "--script" ]; then
  shift
  exec python3 "$@"
fi
python3 -m pytest -p no:cacheprovider -x -q "${@:-tests/serve/test_server_live.py}" 2>&1 | tee "$OUT/serve_demo.log"
