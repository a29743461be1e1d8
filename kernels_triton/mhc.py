"""mHC (manifold-constrained hyper-connections) of DeepSeek-V4: Sinkhorn split, pre (collapse), post.

SGLang 0.5.23 gets these from `sglang/kernels/ops/layernorm/mhc.py`, whose fast versions are
TileLang kernels compiled at run time (`tilelang.jit`), which Windows does not have. SGLang does not
import them through a `tilelang` entry point of its own, so winport's shims/tilelang stays empty
and these are plain functions with the upstream signatures, for the lead to patch in:

- `hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-6)
  -> (pre [b, s, hc], post [b, s, hc], comb [b, s, hc, hc])` (dtype of `mixes`)
  replaces sglang.kernels.ops.layernorm.mhc.hc_split_sinkhorn (TileLang), called from
  deepseek_v4.py (DeepseekV4DecoderLayer.hc_pre) and deepseek_v4_mhc.py (_mix_stats_impl).
- `mhc_pre(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
  sinkhorn_repeat, n_splits=1, n_splits_pre=32, *, norm_weight=None, norm_eps=None)
  -> (post_mix [..., hc, 1] f32, comb_mix [..., hc, hc] f32, layer_input [..., h] bf16)`
  replaces sglang.kernels.ops.layernorm.mhc.mhc_pre (TileLang + DeepGEMM tf32 prenorm GEMM).
- `mhc_post(x, residual, post_layer_mix, comb_res_mix) -> out [T, hc, h]` (dtype of residual)
  replaces sglang.kernels.ops.layernorm.mhc.mhc_post (TileLang).

Math (per token; hc streams of width h; mixes = (2 + hc) * hc numbers):
  rsqrt = 1 / sqrt(mean(x_flat^2) + rms_eps);  mixes = (x_flat @ fn^T) * rsqrt   (mhc_pre only)
  pre  = sigmoid(mixes[:hc] * scale[0] + base[:hc]) + pre_eps
  post = post_mult * sigmoid(mixes[hc:2hc] * scale[1] + base[hc:2hc])   (post_mult = 2 in split)
  comb = softmax_rows(mixes[2hc:] * scale[2] + base[2hc:]) + eps; comb /= colsum + eps;
         then (iters - 1) x { comb /= rowsum + eps; comb /= colsum + eps }
  layer_input = sum_i pre[i] * residual[i]  (then RMSNorm(norm_weight, norm_eps) of its bf16 value)
  post out[j] = post[j] * x + sum_i comb[i, j] * residual[i]
Each function: CUDA -> Triton, otherwise the torch reference (`*_reference`, also the CPU path).
"""

from __future__ import annotations

import torch

from kernels_triton._dispatch import use_triton

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except ImportError:  # pragma: no cover
    _HAVE_TRITON = False


def _use_triton(t: torch.Tensor) -> bool:
    return _HAVE_TRITON and use_triton(t)


# --------------------------------------------------------------------------------------------
# torch references (CPU path)
# --------------------------------------------------------------------------------------------
def _split_sinkhorn_math(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, hc: int,
                         iters: int, pre_eps: float, sk_eps: float, post_mult: float
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixes [..., (2+hc)*hc] fp32 -> pre [..., hc], post [..., hc], comb [..., hc, hc] (fp32)."""
    scale = hc_scale.float()
    base = hc_base.float()
    pre = torch.sigmoid(mixes[..., :hc] * scale[0] + base[:hc]) + pre_eps
    post = post_mult * torch.sigmoid(mixes[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    logits = mixes[..., 2 * hc:].unflatten(-1, (hc, hc)) * scale[2] + base[2 * hc:].view(hc, hc)
    comb = torch.softmax(logits, dim=-1) + sk_eps
    comb = comb / (comb.sum(-2, keepdim=True) + sk_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + sk_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + sk_eps)
    return pre, post, comb


def hc_split_sinkhorn_reference(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                                hc_mult: int = 4, sinkhorn_iters: int = 20, eps: float = 1e-6
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch `hc_split_sinkhorn` (post multiplier 2, as upstream)."""
    pre, post, comb = _split_sinkhorn_math(mixes.float(), hc_scale, hc_base, hc_mult, sinkhorn_iters,
                                           eps, eps, 2.0)
    return pre.to(mixes.dtype), post.to(mixes.dtype), comb.to(mixes.dtype)


def mhc_pre_reference(residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                      rms_eps: float, hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float,
                      sinkhorn_repeat: int, n_splits: int = 1, n_splits_pre: int = 32, *,
                      norm_weight: torch.Tensor | None = None, norm_eps: float | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch `mhc_pre`; `n_splits*` only tune upstream's kernels and are ignored."""
    del n_splits, n_splits_pre
    hc, h = residual.shape[-2:]
    outer = residual.shape[:-2]
    res = residual.reshape(-1, hc, h).float()
    x_flat = res.flatten(1)
    rsqrt = torch.rsqrt(x_flat.square().mean(-1, keepdim=True) + rms_eps)
    mixes = (x_flat @ fn.float().t()) * rsqrt
    pre, post, comb = _split_sinkhorn_math(mixes, hc_scale, hc_base, hc, sinkhorn_repeat, hc_pre_eps,
                                           hc_sinkhorn_eps, hc_post_mult_value)
    y = (pre.unsqueeze(-1) * res).sum(1)
    if norm_weight is not None:
        if norm_eps is None:
            raise ValueError("norm_eps is required with norm_weight")
        # Upstream normalises the bf16-rounded collapse with fp32 statistics of the unrounded one.
        ss = y.square().mean(-1, keepdim=True)
        y = y.to(torch.bfloat16).float() * torch.rsqrt(ss + norm_eps) * norm_weight.to(torch.bfloat16).float()
    return (post.reshape(*outer, hc, 1), comb.reshape(*outer, hc, hc),
            y.to(torch.bfloat16).reshape(*outer, h))


def mhc_post_reference(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                       comb_res_mix: torch.Tensor) -> torch.Tensor:
    """Torch `mhc_post`: out[t, j] = post[t, j] * x[t] + sum_i comb[t, i, j] * residual[t, i]."""
    t, hc, h = residual.shape
    post = post_layer_mix.reshape(t, hc, 1).float()
    out = post * x.float().unsqueeze(1) + torch.einsum("tij,tih->tjh", comb_res_mix.float(), residual.float())
    return out.to(residual.dtype)


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------
if _HAVE_TRITON:

    @triton.jit
    def _sinkhorn_tile(mix_ptr, scale_ptr, base_ptr, pre_eps, sk_eps, post_mult,
                       HC: tl.constexpr, HCP: tl.constexpr, ITERS: tl.constexpr):
        """One token's (pre, post, comb) from its (2+HC)*HC mixes at mix_ptr (fp32)."""
        i = tl.arange(0, HCP)
        im = i < HC
        s0 = tl.load(scale_ptr)
        s1 = tl.load(scale_ptr + 1)
        s2 = tl.load(scale_ptr + 2)
        pre = tl.sigmoid(tl.load(mix_ptr + i, mask=im, other=0.0) * s0
                         + tl.load(base_ptr + i, mask=im, other=0.0)) + pre_eps
        post = post_mult * tl.sigmoid(tl.load(mix_ptr + HC + i, mask=im, other=0.0) * s1
                                      + tl.load(base_ptr + HC + i, mask=im, other=0.0))
        cm = im[:, None] & im[None, :]
        off = 2 * HC + i[:, None] * HC + i[None, :]
        logit = tl.load(mix_ptr + off, mask=cm, other=0.0) * s2 + tl.load(base_ptr + off, mask=cm, other=0.0)
        logit = tl.where(cm, logit, float("-inf"))
        e = tl.exp(logit - tl.max(logit, axis=1)[:, None])
        e = tl.where(cm, e, 0.0)
        comb = tl.where(cm, e / tl.sum(e, axis=1)[:, None] + sk_eps, 0.0)
        comb = tl.where(cm, comb / (tl.sum(comb, axis=0)[None, :] + sk_eps), 0.0)
        for _ in tl.static_range(ITERS - 1):
            comb = tl.where(cm, comb / (tl.sum(comb, axis=1)[:, None] + sk_eps), 0.0)
            comb = tl.where(cm, comb / (tl.sum(comb, axis=0)[None, :] + sk_eps), 0.0)
        return pre, post, comb

    @triton.jit
    def _split_sinkhorn_kernel(mix_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr, eps,
                               HC: tl.constexpr, HCP: tl.constexpr, ITERS: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        pre, post, comb = _sinkhorn_tile(mix_ptr + t * (2 + HC) * HC, scale_ptr, base_ptr, eps, eps, 2.0,
                                         HC, HCP, ITERS)
        i = tl.arange(0, HCP)
        im = i < HC
        tl.store(pre_ptr + t * HC + i, pre.to(pre_ptr.dtype.element_ty), mask=im)
        tl.store(post_ptr + t * HC + i, post.to(post_ptr.dtype.element_ty), mask=im)
        tl.store(comb_ptr + t * HC * HC + i[:, None] * HC + i[None, :], comb.to(comb_ptr.dtype.element_ty),
                 mask=im[:, None] & im[None, :])

    @triton.jit
    def _mhc_mix_partial_kernel(x_ptr, fn_ptr, part_ptr, sq_ptr, T, KTOT, k_per_split,
                                NMIX: tl.constexpr, NMIXP: tl.constexpr, BLOCK_T: tl.constexpr,
                                BLOCK_K: tl.constexpr):
        """Partial (x_flat @ fn^T, sum x^2) over one K slice for BLOCK_T tokens (split-K)."""
        pt = tl.program_id(0)
        ps = tl.program_id(1)
        offs_t = pt * BLOCK_T + tl.arange(0, BLOCK_T)
        tm = offs_t < T
        j = tl.arange(0, NMIXP)
        jm = j < NMIX
        acc = tl.zeros((BLOCK_T, NMIXP), dtype=tl.float32)
        sq = tl.zeros((BLOCK_T,), dtype=tl.float32)
        k0 = ps * k_per_split
        k1 = tl.minimum(k0 + k_per_split, KTOT)
        for kb in range(k0, k1, BLOCK_K):
            kk = kb + tl.arange(0, BLOCK_K)
            km = kk < k1
            x = tl.load(x_ptr + offs_t[:, None].to(tl.int64) * KTOT + kk[None, :],
                        mask=tm[:, None] & km[None, :], other=0.0).to(tl.float32)
            w = tl.load(fn_ptr + j[None, :] * KTOT + kk[:, None], mask=jm[None, :] & km[:, None], other=0.0)
            # Exact fp32 products: the mixes feed sigmoid/softmax gains, tf32 would cost 1e-3 there.
            acc += tl.dot(x, w, input_precision="ieee")
            sq += tl.sum(x * x, axis=1)
        base = ps.to(tl.int64) * T
        tl.store(part_ptr + (base + offs_t[:, None]) * NMIXP + j[None, :], acc, mask=tm[:, None])
        tl.store(sq_ptr + base + offs_t, sq, mask=tm)

    @triton.jit
    def _mhc_pre_finish_kernel(part_ptr, sq_ptr, scale_ptr, base_ptr, res_ptr, post_ptr, comb_ptr, y_ptr,
                               nw_ptr, T, H, SPLITS, rms_eps, pre_eps, sk_eps, post_mult, norm_eps,
                               HC: tl.constexpr, HCP: tl.constexpr, NMIXP: tl.constexpr,
                               ITERS: tl.constexpr, BLOCK_H: tl.constexpr, HAS_NORM: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, NMIXP)
        mixes = tl.zeros((NMIXP,), dtype=tl.float32)
        ss = 0.0
        for s in range(SPLITS):
            mixes += tl.load(part_ptr + (s * T + t) * NMIXP + j)
            ss += tl.load(sq_ptr + s * T + t)
        rs = tl.rsqrt(ss / (HC * H) + rms_eps)
        # Stage the normalised mixes through the (token-private) partial row of split 0 so the
        # shared Sinkhorn helper can read them by pointer.
        mrow = part_ptr + t * NMIXP
        tl.store(mrow + j, mixes * rs)
        tl.debug_barrier()
        pre, post, comb = _sinkhorn_tile(mrow, scale_ptr, base_ptr, pre_eps, sk_eps, post_mult, HC, HCP, ITERS)
        i = tl.arange(0, HCP)
        im = i < HC
        tl.store(post_ptr + t * HC + i, post, mask=im)
        tl.store(comb_ptr + t * HC * HC + i[:, None] * HC + i[None, :], comb, mask=im[:, None] & im[None, :])
        # Collapse: y = sum_i pre[i] * residual[i]; optional RMSNorm on its bf16 value.
        ysq = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            hh = h0 + tl.arange(0, BLOCK_H)
            hm = hh < H
            r = tl.load(res_ptr + t * HC * H + i[:, None] * H + hh[None, :], mask=im[:, None] & hm[None, :],
                        other=0.0).to(tl.float32)
            y = tl.sum(pre[:, None] * r, axis=0)
            ysq += y * y
            tl.store(y_ptr + t * H + hh, y.to(y_ptr.dtype.element_ty), mask=hm)
        if HAS_NORM:
            tl.debug_barrier()  # this program re-reads the bf16 values it just wrote
            inv = tl.rsqrt(tl.sum(ysq, axis=0) / H + norm_eps)
            for h0 in range(0, H, BLOCK_H):
                hh = h0 + tl.arange(0, BLOCK_H)
                hm = hh < H
                y = tl.load(y_ptr + t * H + hh, mask=hm, other=0.0).to(tl.float32)
                w = tl.load(nw_ptr + hh, mask=hm, other=0.0).to(tl.float32)
                tl.store(y_ptr + t * H + hh, (y * inv * w).to(y_ptr.dtype.element_ty), mask=hm)

    @triton.jit
    def _mhc_post_kernel(x_ptr, res_ptr, post_ptr, comb_ptr, out_ptr, H,
                         s_xt, s_rt, s_ri, s_pt, s_ct, s_ci,
                         HC: tl.constexpr, HCP: tl.constexpr, BLOCK_H: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        hh = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        hm = hh < H
        i = tl.arange(0, HCP)
        im = i < HC
        x = tl.load(x_ptr + t * s_xt + hh, mask=hm, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + t * s_rt + i[:, None] * s_ri + hh[None, :], mask=im[:, None] & hm[None, :],
                    other=0.0).to(tl.float32)
        post = tl.load(post_ptr + t * s_pt + i, mask=im, other=0.0).to(tl.float32)
        comb = tl.load(comb_ptr + t * s_ct + i[:, None] * s_ci + i[None, :], mask=im[:, None] & im[None, :],
                       other=0.0).to(tl.float32)  # comb[i (input stream), j (output stream)]
        mixed = tl.sum(comb[:, :, None] * r[:, None, :], axis=0)  # [j, h]
        out = post[:, None] * x[None, :] + mixed
        tl.store(out_ptr + t * HC * H + i[:, None] * H + hh[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=im[:, None] & hm[None, :])


# --------------------------------------------------------------------------------------------
# Public entry points (upstream signatures)
# --------------------------------------------------------------------------------------------
def hc_split_sinkhorn(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, hc_mult: int = 4,
                      sinkhorn_iters: int = 20, eps: float = 1e-6
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Replaces sglang.kernels.ops.layernorm.mhc.hc_split_sinkhorn. mixes [b, s, (2+hc)*hc]."""
    b, s, _ = mixes.shape
    if b * s == 0 or not _use_triton(mixes):
        return hc_split_sinkhorn_reference(mixes, hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)
    flat = mixes.reshape(b * s, (2 + hc_mult) * hc_mult).float().contiguous()
    pre = torch.empty(b, s, hc_mult, dtype=mixes.dtype, device=mixes.device)
    post = torch.empty_like(pre)
    comb = torch.empty(b, s, hc_mult, hc_mult, dtype=mixes.dtype, device=mixes.device)
    _split_sinkhorn_kernel[(b * s,)](flat, hc_scale.float().contiguous(), hc_base.float().contiguous(),
                                     pre, post, comb, float(eps), HC=hc_mult,
                                     HCP=triton.next_power_of_2(hc_mult), ITERS=sinkhorn_iters, num_warps=1)
    return pre, post, comb


def mhc_pre(residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
            rms_eps: float, hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float,
            sinkhorn_repeat: int, n_splits: int = 1, n_splits_pre: int = 32, *,
            norm_weight: torch.Tensor | None = None, norm_eps: float | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Replaces sglang.kernels.ops.layernorm.mhc.mhc_pre. residual [..., hc, h] bf16, fn [(2+hc)hc, hc*h]."""
    hc, h = residual.shape[-2:]
    outer = residual.shape[:-2]
    t = residual.numel() // (hc * h) if residual.numel() else 0
    if t == 0 or not _use_triton(residual):
        return mhc_pre_reference(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                                 hc_post_mult_value, sinkhorn_repeat, norm_weight=norm_weight,
                                 norm_eps=norm_eps)
    if norm_weight is not None and norm_eps is None:
        raise ValueError("norm_eps is required with norm_weight")
    dev = residual.device
    res = residual.reshape(t, hc, h).contiguous()
    nmix = (2 + hc) * hc
    nmixp = triton.next_power_of_2(nmix)
    ktot = hc * h
    block_t = 16 if t <= 16 else 32
    block_k = 128
    t_blocks = triton.cdiv(t, block_t)
    # Split K until there are ~2 CTAs per SM: decode (t=1) is a GEMV over fn's 2 MB.
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if residual.is_cuda else 2
    splits = max(1, min(triton.cdiv(ktot, block_k * 4), (2 * sms) // t_blocks))
    k_per_split = triton.cdiv(triton.cdiv(ktot, splits), block_k) * block_k
    splits = triton.cdiv(ktot, k_per_split)
    part = torch.empty(splits, t, nmixp, dtype=torch.float32, device=dev)
    sq = torch.empty(splits, t, dtype=torch.float32, device=dev)
    _mhc_mix_partial_kernel[(t_blocks, splits)](res, fn.float().contiguous(), part, sq, t, ktot, k_per_split,
                                                NMIX=nmix, NMIXP=nmixp, BLOCK_T=block_t, BLOCK_K=block_k,
                                                num_warps=4)
    post = torch.empty(t, hc, 1, dtype=torch.float32, device=dev)
    comb = torch.empty(t, hc, hc, dtype=torch.float32, device=dev)
    y = torch.empty(t, h, dtype=torch.bfloat16, device=dev)
    nw = norm_weight.to(torch.bfloat16).contiguous() if norm_weight is not None else y
    _mhc_pre_finish_kernel[(t,)](part, sq, hc_scale.float().contiguous(), hc_base.float().contiguous(), res,
                                 post, comb, y, nw, t, h, splits, float(rms_eps), float(hc_pre_eps),
                                 float(hc_sinkhorn_eps), float(hc_post_mult_value),
                                 float(norm_eps or 0.0), HC=hc, HCP=triton.next_power_of_2(hc), NMIXP=nmixp,
                                 ITERS=sinkhorn_repeat, BLOCK_H=512, HAS_NORM=norm_weight is not None,
                                 num_warps=4)
    return post.view(*outer, hc, 1), comb.view(*outer, hc, hc), y.view(*outer, h)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
             comb_res_mix: torch.Tensor) -> torch.Tensor:
    """Replaces sglang.kernels.ops.layernorm.mhc.mhc_post. x [T, h], residual [T, hc, h]."""
    t, hc, h = residual.shape
    if t == 0 or not _use_triton(residual):
        return mhc_post_reference(x, residual, post_layer_mix, comb_res_mix)
    x = x if x.stride(-1) == 1 else x.contiguous()
    residual = residual if residual.stride(-1) == 1 else residual.contiguous()
    post = post_layer_mix.reshape(t, hc)
    comb = comb_res_mix if comb_res_mix.stride(-1) == 1 else comb_res_mix.contiguous()
    out = torch.empty(t, hc, h, dtype=residual.dtype, device=residual.device)
    block_h = 512
    _mhc_post_kernel[(t, triton.cdiv(h, block_h))](
        x, residual, post, comb, out, h, x.stride(0), residual.stride(0), residual.stride(1), post.stride(0),
        comb.stride(0), comb.stride(1), HC=hc, HCP=triton.next_power_of_2(hc), BLOCK_H=block_h, num_warps=4)
    return out
