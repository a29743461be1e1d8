"""winport.patches.dsv41_cuda_without_jit: V4.1's indexer stays off SGLang's CUDA JIT kernels.

Checked in a fresh interpreter in which SGLang believes it runs on an SM90 GPU (the H200, where
upstream picks all three JIT paths): after the patch each choice falls to the plain path, the
platform the decode scoring sees is not SM90 while everything else about it is unchanged, and
applying twice changes nothing. The plain paths themselves are what the CPU server runs
(tests/serve/test_v41_demo.py) and what tests/serve/test_dspark_live.py runs on the H200.
"""

from __future__ import annotations

from tests.helpers import FAKE_SM90_CUDA, SGLANG_ON_WINPORT_ENV, run_python


def test_the_three_jit_choices_fall_to_the_plain_paths() -> None:
    code = FAKE_SM90_CUDA + (
        "import sglang.srt.layers.attention.dsv4.v41_indexer.full_topk as ft\n"
        "import sglang.srt.layers.attention.dsv4.v41_indexer.scoring as sc\n"
        "import sglang.kernels.ops.gemm.small_gemm_bf16 as sg\n"
        "from winport.patches import dsv41_cuda_without_jit as p\n"
        "real = sc.get_platform()\n"
        "print('before', ft.is_deep_select_supported(), real.is_sm90)\n"
        "p.register_patch(); p.apply()\n"
        "seen = sc.get_platform()\n"
        "print('after', ft.is_deep_select_supported(), seen.is_sm90, sg.can_use_n128k512_gemm(128, 512, 4),\n"
        "      sg.can_use_n32k5120_gemm(32, 5120, 4))\n"
        "print('rest', seen.is_cuda == real.is_cuda and seen.is_cuda, not hasattr(sc.get_platform.__wrapped__, '__wrapped__'))\n"
    )
    # As `winport serve` runs SGLang on CUDA (winport/serve/command.py), like test_no_linux_kernel_libraries.
    proc = run_python(code, env=SGLANG_ON_WINPORT_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after, rest = proc.stdout.strip().splitlines()[-3:]
    # Upstream picks DeepSelect and the paged SM90 route here: the check must see that first.
    assert before == "before True True", before
    assert after == "after False False False False", after
    assert rest == "rest True True", rest
