"""FP8 block-scaled batched contraction for DeepSeek-V4's grouped output projection (wo_a).

Replaces DeepGEMM's `fp8_einsum` for the one expression SGLang 0.5.23 uses
(`sglang/srt/models/deepseek_v4.py::_fp8_wo_a_einsum`):

    "bhr,hdr->bhd":  out[b, h, d] = sum_r dequant(a)[b, h, r] * dequant(w)[h, d, r]

- a    [B, H, R] float8_e4m3fn, a_scale [B, H, ceil(R / bk)] float32 (per token-group along R)
- w    [H, D, R] float8_e4m3fn, w_scale [H, ceil(D / bn), ceil(R / bk)] float32
- out  [B, H, D] (bf16), written in place; optional `c` is added (DeepGEMM's accumulate input).

Each group h is one `fp8_block_gemm` with the batch axis on h: the activation/output views are
strided (h is the middle dimension), which the kernel takes as strides, so nothing is copied.
"""

from __future__ import annotations

import torch

from kernels_triton.fp8_gemm import _use_triton, fp8_block_gemm, fp8_block_gemm_reference

SUPPORTED_EXPRS = ("bhr,hdr->bhd",)


def fp8_einsum_reference(expr: str, a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor,
                         w_scale: torch.Tensor, block_size: tuple[int, int],
                         out: torch.Tensor | None = None, c: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch `bhr,hdr->bhd` (the CPU path): dequantize, fp32 batched matmul over h."""
    if expr.replace(" ", "") not in SUPPORTED_EXPRS:
        raise NotImplementedError(f"fp8_einsum: unsupported expression {expr!r}")
    res = fp8_block_gemm_reference(a.transpose(0, 1), a_scale.transpose(0, 1), w, w_scale, block_size,
                                   torch.float32).transpose(0, 1)
    if c is not None:
        res = res + c.float()
    if out is None:
        return res.to(torch.bfloat16)
    out.copy_(res)
    return out


def fp8_einsum_bhr_hdr(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                       block_size: tuple[int, int], out: torch.Tensor | None = None,
                       c: torch.Tensor | None = None) -> torch.Tensor:
    """`bhr,hdr->bhd` on the device of `a`: Triton on CUDA, the torch reference elsewhere."""
    bsz, h, r = a.shape
    h2, d, r2 = w.shape
    if (h, r) != (h2, r2):
        raise ValueError(f"fp8_einsum: a {tuple(a.shape)} and w {tuple(w.shape)} disagree")
    if not _use_triton(a):
        return fp8_einsum_reference("bhr,hdr->bhd", a, a_scale, w, w_scale, block_size, out, c)
    if out is None:
        out = torch.empty(bsz, h, d, dtype=torch.bfloat16, device=a.device)
    fp8_block_gemm(a.transpose(0, 1), a_scale.float().transpose(0, 1), w, w_scale.float(), block_size,
                   out.dtype, out=out.transpose(0, 1), c=None if c is None else c.transpose(0, 1))
    return out
