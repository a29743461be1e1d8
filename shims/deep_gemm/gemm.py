"""DeepGEMM's FP8 GEMM entry points, on winport's Triton kernels (CUDA) or torch (CPU).

Upstream (deepseek-ai/DeepGEMM, as sgl-deep-gemm) functions replaced, same Python signatures:
- `fp8_gemm_nt(a, b, d, c=None, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False) -> None`
  (called by sglang/srt/layers/deep_gemm_wrapper/entrypoint.py::gemm_nt_f8f8bf16)
- `fp8_einsum(expr, a, b, d, c=None, recipe=(1, 128, 128)) -> None`
  (called by sglang/srt/models/deepseek_v4.py::_fp8_wo_a_einsum, expression "bhr,hdr->bhd")
- `transform_sf_into_required_layout(sf, mn, k, recipe, num_groups=None, is_sfa=False,
  disable_ue8m0_cast=False) -> Tensor` (deepseek_v4.py::_setup_fp8_wo_a_scales, fp8.py)

Scale formats accepted (a = (data, scale), b = (data, scale)):
- float32 block scales of any strides (DeepGEMM's MN-major TMA-aligned ones included):
  sfa [..., M, ceil(K/gk)], sfb [..., ceil(N/gn), ceil(K/gk)]. The granularity is read from the
  shapes (the recipe only breaks ties), so (1,128,128), (1,1,128) and V4.1's (1,32,32) all work.
- int32 packed UE8M0 (four exponent bytes per int32, what SGLang's `scale_ue8m0=True` quantizers
  and DeepGEMM's layout helpers produce on SM100/SM120): unpacked to float32 before the GEMM.

`transform_sf_into_required_layout` therefore returns float32 scales in a plain contiguous layout:
winport's kernels take block scales as they are, so the "required layout" is the input itself
(no UE8M0 rounding is applied, which keeps the checkpoint's exact scales).
"""

from __future__ import annotations

import torch

from kernels_triton.fp8_einsum import SUPPORTED_EXPRS, fp8_einsum_bhr_hdr
from kernels_triton.fp8_gemm import fp8_block_gemm, unpack_ue8m0_scales

__all__ = ["fp8_einsum", "fp8_gemm_nt", "transform_sf_into_required_layout"]

_GRANULARITIES = (1, 16, 32, 64, 128, 256, 512)


def _infer_granularity(extent: int, n_scales: int, hint: int | None) -> int:
    """The block size g with ceil(extent / g) == n_scales, preferring the recipe's `hint`."""
    if hint and -(-extent // hint) == n_scales:
        return hint
    for g in _GRANULARITIES:
        if -(-extent // g) == n_scales:
            return g
    if n_scales > 0 and extent % n_scales == 0:
        return extent // n_scales
    raise ValueError(f"cannot infer a scale block size: {extent} elements, {n_scales} scales")


def _float_scales(sf: torch.Tensor, mn: int, k: int, gk_hint: int) -> torch.Tensor:
    if sf.dtype == torch.int32:
        return unpack_ue8m0_scales(sf, -(-k // gk_hint))
    return sf.float()


def _recipe_parts(recipe: tuple[int, int, int] | None) -> tuple[int | None, int | None, int]:
    """(gm_a, gn_b, gk) hints from DeepGEMM's recipe (sfa granularity (1, gk), sfb (gn, gk))."""
    if recipe is None:
        return None, None, 128
    _, gn, gk = (int(x) for x in recipe)
    return 1, gn, gk


def fp8_gemm_nt(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], d: torch.Tensor,
                c: torch.Tensor | None = None, recipe: tuple[int, int, int] | None = None,
                compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
    """DeepGEMM `fp8_gemm_nt`: d = dequant(a) @ dequant(b)^T (+ c), in place.

    a = (fp8 [M, K], sfa), b = (fp8 [N, K], sfb), d [M, N] bf16 or fp32. `compiled_dims` and
    `disable_ue8m0_cast` only steer DeepGEMM's JIT and are accepted and ignored.
    """
    del compiled_dims, disable_ue8m0_cast
    (x, sfa), (w, sfb) = a, b
    m, k = x.shape
    n = w.shape[0]
    _, gn_hint, gk_hint = _recipe_parts(recipe)
    sfa_f = _float_scales(sfa, m, k, gk_hint)
    sfb_f = _float_scales(sfb, n, k, gk_hint)
    gk = _infer_granularity(k, sfa_f.shape[-1], gk_hint)
    if sfb_f.shape[-1] != sfa_f.shape[-1]:
        raise ValueError(f"sfa {tuple(sfa_f.shape)} and sfb {tuple(sfb_f.shape)} disagree on K groups")
    gn = _infer_granularity(n, sfb_f.shape[0], gn_hint)
    fp8_block_gemm(x, sfa_f, w, sfb_f, (gn, gk), d.dtype, out=d, c=c)


def fp8_einsum(expr: str, a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
               d: torch.Tensor, c: torch.Tensor | None = None,
               recipe: tuple[int, int, int] = (1, 128, 128)) -> None:
    """DeepGEMM `fp8_einsum` for "bhr,hdr->bhd" (DeepSeek-V4 wo_a), writing `d` [B, H, D] in place."""
    if expr.replace(" ", "") not in SUPPORTED_EXPRS:
        raise NotImplementedError(f"winport's deep_gemm.fp8_einsum supports {SUPPORTED_EXPRS}, not {expr!r}")
    (x, sfa), (w, sfw) = a, b
    r = x.shape[-1]
    dd = w.shape[1]
    _, gn_hint, gk_hint = _recipe_parts(recipe)
    sfa_f = _float_scales(sfa, x.shape[0], r, gk_hint)
    sfw_f = _float_scales(sfw, dd, r, gk_hint)
    gk = _infer_granularity(r, sfa_f.shape[-1], gk_hint)
    gn = _infer_granularity(dd, sfw_f.shape[-2], gn_hint)
    fp8_einsum_bhr_hdr(x, sfa_f, w, sfw_f, (gn, gk), out=d, c=c)


def transform_sf_into_required_layout(sf: torch.Tensor, mn: int, k: int, recipe: tuple[int, ...],
                                      num_groups: int | None = None, is_sfa: bool = False,
                                      disable_ue8m0_cast: bool = False) -> torch.Tensor:
    """DeepGEMM `transform_sf_into_required_layout`: here the identity on float32 block scales.

    winport's GEMMs read block scales in their natural [(groups,) ceil(mn/g), ceil(k/gk)] layout,
    so the scales come back as contiguous float32 (packed UE8M0 input is unpacked).
    """
    del mn, num_groups, is_sfa, disable_ue8m0_cast
    if sf.dtype == torch.int32:
        return unpack_ue8m0_scales(sf, -(-k // int(recipe[-1])))
    return sf.float().contiguous()
