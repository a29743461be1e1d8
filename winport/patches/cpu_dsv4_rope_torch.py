"""DeepSeek-V4's rotary embedding on CPU in torch instead of Triton's interpreter.

Targets sglang 0.5.23 `kernels/ops/attention/dsv4/rope.py:apply_rotary_emb_triton`, which
`norm_rope.py:fused_rope_inplace` calls on the device-generic route that winport takes
(winport.patches.dsv4_generic_device). It launches a Triton kernel with one program per
(token, head); on CPU that kernel runs in Triton's interpreter (TRITON_INTERPRET=1), which spent
about a third of the demo server's time (a 78-token prefill: three quarters; measured with
scripts/bench/cpu_serve.py). The rotation is a few tensor operations in torch.

The rotation (GPT-J interleaved pairs by freqs_cis, in float32, in place; the kernel's semantics,
not its code) is kernels_triton.dsv4_cpu_ops.rotary_gptj_inplace; this patch only hooks it in for CPU
tensors. Tensors on any other device keep the Triton kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from kernels_triton.dsv4_cpu_ops import rotary_gptj_inplace
from winport import envs
from winport.patches._base import register, require_source

# WINPORT_CPU_TORCH_KERNELS=0 leaves the Triton kernels (interpreted on CPU) in place.
SWITCH = envs.WINPORT_CPU_TORCH_KERNELS.name

TARGET = "sglang.kernels.ops.attention.dsv4.rope.apply_rotary_emb_triton"


def _apply(original: Any, x: torch.Tensor, freqs_cis: torch.Tensor, positions: torch.Tensor | None = None,
           inverse: bool = False) -> torch.Tensor:
    if x.device.type != "cpu":
        return original(x, freqs_cis, positions=positions, inverse=inverse)
    return rotary_gptj_inplace(x, freqs_cis, positions, inverse)


def register_patch() -> None:
    """Check that the kernel still computes what rotary_gptj_inplace does, then register."""
    # The kernel is a triton JITFunction (no inspectable function): its module's source is checked.
    require_source(
        "sglang.kernels.ops.attention.dsv4.rope",
        "offs_x_real = base_offset + offs_pair * 2 * stride_x_dim",
        "offs_x_imag = base_offset + (offs_pair * 2 + 1) * stride_x_dim",
        "out_real = x_real * freq_real + x_imag * freq_imag",
        "out_imag = x_imag * freq_real - x_real * freq_imag",
        "out_real = x_real * freq_real - x_imag * freq_imag",
        "out_imag = x_real * freq_imag + x_imag * freq_real",
    )
    require_source(TARGET, "freqs_real = torch.view_as_real(freqs_cis).flatten(-2)",
                   "positions: Optional[torch.Tensor] = None", "inverse: bool = False")
    require_source("sglang.kernels.ops.attention.dsv4.norm_rope.fused_rope_inplace",
                   "apply_rotary_emb_triton(q, freqs_cis, positions=positions, inverse=inverse)")
    if not envs.WINPORT_CPU_TORCH_KERNELS.get():  # benchmarks compare with the interpreted kernels
        return
    register(TARGET, _apply)
