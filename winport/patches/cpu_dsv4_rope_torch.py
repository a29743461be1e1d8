"""DeepSeek-V4's rotary embedding on CPU in torch instead of Triton's interpreter.

Targets sglang 0.5.23 `kernels/ops/attention/dsv4/rope.py:apply_rotary_emb_triton`, which
`norm_rope.py:fused_rope_inplace` calls on the device-generic route that winport takes
(winport.patches.dsv4_generic_device). It launches a Triton kernel with one program per
(token, head); on CPU that kernel runs in Triton's interpreter (TRITON_INTERPRET=1), which spent
about a third of the demo server's time (a 78-token prefill: three quarters; measured with
scripts/bench/cpu_serve.py). The rotation is a few tensor operations in torch.

Semantics carried over from the kernel (not its code): GPT-J (interleaved) pairs
(x[2i], x[2i+1]) of the last dimension are rotated in place by freqs_cis (complex, one row per
position; row `positions[b]` for token b, or row b when positions is None), in float32, and
stored back in x's dtype; `inverse` rotates by the conjugate. x is [tokens, rope_dim] or
[tokens, heads, rope_dim] and may be a strided view (the rope part of q or kv). Tensors on any
other device keep the Triton kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from winport import envs
from winport.patches._base import register, require_source

# WINPORT_CPU_TORCH_KERNELS=0 leaves the Triton kernels (interpreted on CPU) in place.
SWITCH = envs.WINPORT_CPU_TORCH_KERNELS.name

TARGET = "sglang.kernels.ops.attention.dsv4.rope.apply_rotary_emb_triton"


def rotary_gptj_inplace(x: torch.Tensor, freqs_cis: torch.Tensor, positions: torch.Tensor | None = None,
                        inverse: bool = False) -> torch.Tensor:
    """Rotate interleaved pairs of x's last dimension in place by freqs_cis[positions]; return x."""
    if x.ndim not in (2, 3):
        raise ValueError(f"dsv4 rope: x must be [tokens, dim] or [tokens, heads, dim], got {tuple(x.shape)}")
    tokens, rope_dim = x.shape[0], x.shape[-1]
    if rope_dim % 2:
        raise ValueError(f"dsv4 rope: rope dim {rope_dim} is odd")
    if positions is not None:
        if positions.shape != (tokens,):
            raise ValueError(f"dsv4 rope: positions shape {tuple(positions.shape)} != ({tokens},)")
        freqs = freqs_cis[positions.long()]
    else:
        if freqs_cis.shape[0] != tokens:
            raise ValueError(f"dsv4 rope: freqs_cis has {freqs_cis.shape[0]} rows for {tokens} tokens")
        freqs = freqs_cis
    # The kernel reads the pairs it needs from the table's first rope_dim/2 columns.
    freqs = torch.view_as_real(freqs[:, : rope_dim // 2]).float()
    cos, sin = freqs[..., 0], freqs[..., 1]
    if x.ndim == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    pairs = x.float().unflatten(-1, (rope_dim // 2, 2))
    re, im = pairs[..., 0], pairs[..., 1]
    if inverse:
        out_re = re * cos + im * sin
        out_im = im * cos - re * sin
    else:
        out_re = re * cos - im * sin
        out_im = re * sin + im * cos
    x.copy_(torch.stack((out_re, out_im), dim=-1).flatten(-2))
    return x


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
