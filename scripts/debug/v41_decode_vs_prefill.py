"""Debug aid: does the V4.1 demo server's decode agree with its own prefill?

Starts `winport serve --demo --demo-variant v41` (CPU or CUDA, eager or with graphs as the
environment says: WINPORT_CUDA_GRAPH), takes 32 greedy tokens for a few prompts, then teacher-forces
each continuation through the same server's prefill and prints, per prompt, the per-step deficit
(best log-probability minus the taken token's; 0 where decode's token is prefill's argmax).
SGLANG_OPT_* variables are passed on (e.g. SGLANG_OPT_FUSE_MHC_POST_PRE=0 to bisect SGLang's
CUDA-only fusions: on CUDA it builds DeepseekV4CudaDecoderLayer, whose mHC boundaries fuse across
layers, where CPU builds the platform layer). On CPU, `TRITON_INTERPRET=1 WINPORT_TRITON_ON_CPU=1`
makes winport's shims run their Triton kernels (interpreted) instead of the torch references, as
they do on CUDA.
Usage: python scripts/debug/v41_decode_vs_prefill.py [serve args...]   (--demo-variant v4 for the V4 demo)
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, ".")
from tests.serve._greedy_judge import server_deficits  # noqa: E402
from tests.serve._server import start, stop, wait_ready  # noqa: E402
from tests.serve.test_dspark_live import PROMPTS, _greedy  # noqa: E402


def main() -> None:
    """Start the server, print decode-vs-prefill deficits for each prompt, stop it."""
    t0 = time.time()
    # tests.serve._server.start drops WINPORT_* / SGLANG_* settings; these are passed on on purpose.
    passed = {k: v for k, v in os.environ.items() if k == "WINPORT_TRITON_ON_CPU" or k.startswith("SGLANG_OPT_")}
    args = sys.argv[1:] if "--demo-variant" in sys.argv else ["--demo-variant", "v41", *sys.argv[1:]]
    srv = start(["--demo", "--max-running-requests", "2", *args], env=passed)
    try:
        wait_ready(srv)
        print(f"ready after {time.time() - t0:.0f} s", flush=True)
        for ids in PROMPTS:
            tokens = _greedy(srv, ids)["output_ids"]
            d = server_deficits(srv.url, ids, tokens)
            print(f"prompt {len(ids)}: exact {sum(x == 0 for x in d)}/{len(d)} worst {max(d):.3f} "
                  f"deficits {[round(x, 3) for x in d]}", flush=True)
    finally:
        stop(srv)


if __name__ == "__main__":
    main()
