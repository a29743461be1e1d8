"""winport.patches.cuda_router_gemm_without_jit: DeepSeek routers stay off SGLang's JIT tiny GEMM.

Checked in a fresh interpreter in which SGLang believes it runs on an SM90 GPU (the H200, where
upstream picks the JIT kernel for V4.1-Flash's 384 x 5120 gate up to 16 rows, as it would on the
users' SM120): after the patch the router's row limit is -1 (never the tiny GEMM), for bf16 and
for the other shapes alike, and applying twice changes nothing. The cuBLAS route it then takes is
what the full-width proxy serves on the H200 (scripts/gpu/proxy_check.py).
"""

from __future__ import annotations

from tests.helpers import FAKE_SM90_CUDA, SGLANG_ON_WINPORT_ENV, run_python


def test_the_router_gemm_falls_to_cublas() -> None:
    code = FAKE_SM90_CUDA + (
        "import torch\n"
        "from sglang.srt.models.deepseek_common.utils import tiny_router_gemm_max_tokens as rows\n"
        "from winport.patches import cuda_router_gemm_without_jit as p\n"
        "shape = dict(num_experts=384, hidden_size=5120, weight_dtype=torch.bfloat16)\n"
        "print('before', rows(**shape))\n"
        "p.register_patch(); p.apply()\n"
        "print('after', rows(**shape), rows(num_experts=256, hidden_size=7168, weight_dtype=torch.bfloat16))\n"
    )
    proc = run_python(code, env=SGLANG_ON_WINPORT_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = proc.stdout.strip().splitlines()[-2:]
    # Upstream picks the tiny GEMM here: the check must see that first.
    assert before == "before 16", before
    assert after == "after -1 -1", after
