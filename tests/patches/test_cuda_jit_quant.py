"""winport.patches.cuda_jit_quant: SGLang's JIT FP8 activation quantizers replaced by the shims.

The adapters run here on CPU tensors (the shim's torch path); on CUDA the same adapters call the
shim's Triton kernel, which tests/ops/test_quant.py checks on the GPU. The rebinding itself is
checked in a fresh interpreter that makes SGLang believe it runs on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import FAKE_SM90_CUDA, run_python_ok
from winport.patches import cuda_jit_quant


def _reference(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = x.double().view(x.shape[0], -1, group)
    scale = g.abs().amax(-1).clamp_min(1e-10) / 448.0
    q = (g / scale[..., None]).clamp(-448, 448).to(torch.float32).to(torch.float8_e4m3fn)
    return q.view_as(x), scale.float()


@pytest.mark.parametrize("tokens", [1, 7, 33])
def test_group_quant_adapter_matches_the_reference(tokens: int) -> None:
    torch.manual_seed(tokens)
    x = (torch.randn(tokens, 512) * 3).to(torch.bfloat16)
    x_q = torch.full((tokens, 512), float("nan")).to(torch.float8_e4m3fn)
    x_s = torch.full((tokens, 4), float("nan"))
    cuda_jit_quant.per_token_group_quant(x, x_q, x_s, 128, scale_ue8m0=False, fuse_silu_and_mul=False,
                                         masked_m=None)
    ref_q, ref_s = _reference(x, 128)
    torch.testing.assert_close(x_s, ref_s, rtol=1e-3, atol=1e-5)
    deq = x_q.float().view(tokens, 4, 128) * x_s[..., None]
    ref = ref_q.float().view(tokens, 4, 128) * ref_s[..., None]
    # One e4m3 step (2^-3 relative) at most where rounding of the scaled value differs.
    torch.testing.assert_close(deq, ref, rtol=0.125, atol=1e-6)
    assert not torch.isnan(deq).any()


@pytest.mark.parametrize("tokens", [1, 9])
def test_v2_adapter_gives_power_of_two_scales(tokens: int) -> None:
    """The UE8M0-in-fp32 route V4.1's [32, 32] linears take: each scale is the smallest power of two
    at or above amax / 448, and the values are the group divided by it."""
    torch.manual_seed(100 + tokens)
    x = (torch.randn(tokens, 256) * 5).to(torch.bfloat16)
    x_q = torch.full((tokens, 256), float("nan")).to(torch.float8_e4m3fn)
    x_s = torch.full((tokens, 8), float("nan"))
    cuda_jit_quant.per_token_group_quant_8bit_v2(x, x_q, x_s, 32, 1e-10, -448.0, 448.0, scale_ue8m0=True)
    g = x.double().view(tokens, 8, 32)
    want_s = torch.exp2(torch.ceil(torch.log2(g.abs().amax(-1).clamp_min(1e-10) / 448.0)))
    torch.testing.assert_close(x_s.double(), want_s, rtol=0, atol=0)
    want_q = (g / want_s[..., None]).clamp(-448, 448).float().to(torch.float8_e4m3fn)
    assert torch.equal(x_q.view(torch.uint8), want_q.view(tokens, 256).view(torch.uint8))
    with pytest.raises(NotImplementedError, match="masked rows"):
        cuda_jit_quant.per_token_group_quant_8bit_v2(x, x_q, x_s, 32, 1e-10, -448.0, 448.0,
                                                     masked_m=torch.ones(1, dtype=torch.int32))


def test_per_token_adapter_gives_one_scale_per_row() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 256).to(torch.bfloat16)
    q = torch.empty(5, 256, dtype=torch.float8_e4m3fn)
    s = torch.full((5, 1), float("nan"))
    cuda_jit_quant.sgl_per_token_quant_fp8(x, q, s)
    torch.testing.assert_close(s[:, 0], x.float().abs().amax(-1) / 448.0, rtol=1e-3, atol=1e-8)


def test_unsupported_variants_fail_by_name() -> None:
    x = torch.randn(2, 256).to(torch.bfloat16)
    q = torch.empty(2, 128, dtype=torch.float8_e4m3fn)
    s = torch.empty(2, 1)
    with pytest.raises(NotImplementedError, match="fused SiLU-and-mul"):
        cuda_jit_quant.per_token_group_quant(x, q, s, 128, fuse_silu_and_mul=True)


def test_fp8_kernel_names_are_rebound_when_sglang_sees_cuda() -> None:
    code = FAKE_SM90_CUDA + (
        "import sglang.srt.utils.common as c\n"
        "from winport.patches import cuda_jit_quant\n"
        "import sglang.kernels.ops.quantization.fp8_kernel as k\n"
        "print(k._is_cuda, k.per_token_group_quant.__module__)\n"
        "cuda_jit_quant.register_patch()\n"
        "import sglang.kernels.ops.quantization.per_token_group_quant_8bit_v2 as v2\n"
        "print(k.per_token_group_quant is cuda_jit_quant.per_token_group_quant,"
        " k.sgl_per_token_quant_fp8 is cuda_jit_quant.sgl_per_token_quant_fp8,"
        " v2.per_token_group_quant_8bit_v2 is cuda_jit_quant.per_token_group_quant_8bit_v2)\n"
    )
    out = run_python_ok(code)
    first, second = out.strip().splitlines()[-2:]
    assert first.startswith("True sglang.kernels.ops.quantization.per_token_group_quant"), first
    assert second == "True True True"
