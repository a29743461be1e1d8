"""FP8 (e4m3) block-scaled GEMM: prefill GEMM and the decode GEMV / split-K paths (M <= 16).

Replaces, for the port: DeepGEMM's `fp8_gemm_nt` (through shims/deep_gemm/gemm.py) and is the kernel
behind sgl_kernel's fp8 blockwise GEMM entry points (the sgl_kernel shim calls `fp8_block_gemm`).

Public API
----------
`fp8_block_gemm(a_fp8, a_scale, b_fp8, b_scale, block_size, out_dtype=torch.bfloat16, *, out=None,
c=None) -> Tensor`
    out[m, n] = sum_k (a_fp8[m, k] * a_scale[m, k // bk]) * (b_fp8[n, k] * b_scale[n // bn, k // bk])
    (+ c[m, n]); the "NT" layout: both operands K-contiguous, out = A @ B^T.

    - a_fp8 [M, K] float8_e4m3fn, any strides (K-contiguous is fastest).
    - a_scale [M, ceil(K / bk)] float32: one scale per token per group of bk along K (what
      `per_token_group_quant_fp8` produces, row- or column-major: strides are honoured).
    - b_fp8 [N, K] float8_e4m3fn (a linear layer's weight).
    - b_scale [ceil(N / bn), ceil(K / bk)] float32 (`weight_scale_inv`); bn = 1 gives per-row scales.
    - block_size (bn, bk): V4.1-Flash dense weights use (32, 32), V4 and sgl-kernel's tests (128, 128).
    - Leading batch dimensions are allowed (same on all operands), used by `fp8_einsum`.
    CUDA -> Triton; any other device -> `fp8_block_gemm_reference` (plain torch, also the CPU path).

`fp8_block_gemm_reference(...)`: same arguments, dequantize + fp32 matmul (N processed in chunks so
    a 25600 x 6144 weight never materialises as one fp32 copy).

`unpack_ue8m0_scales(sf, num_groups)`: DeepGEMM's packed UE8M0 scales (int32 holding four exponent
    bytes, lowest byte = lowest K group) -> float32 powers of two [..., num_groups].

Kernel notes (why it looks like this)
- Decode is bound by reading the weight once. A tensor-core-free GEMV kernel (`_fp8_gemv_kernel`,
  1..8 rows; its docstring says why it looks like it does) by default for M = 1..3, and up to 6 rows
  where GEMV_TUNED says so (`default_gemv_config` says why); other M <= 16 and batched
  operands: the tl.dot kernel with a 16-row tile. Both can split K over CTAs
  with a "last CTA reduces" epilogue (per-tile arrival counter) so no extra reduction kernel is
  launched; the counters reset themselves, which keeps the path CUDA-graph safe.
- Two inner-loop modes: FP8 dot (tile K == scale group, per-group rescale of the fp32 partial) and
  DEQUANT (tile K spans several groups: both tiles are scaled in fp32, rounded to bf16 and multiplied
  on bf16 tensor cores). DEQUANT is also the path for GPUs without FP8 MMA (< SM89).
- Prefill with 32-wide groups (V4.1) and M >= 256: dequantize both operands to bf16 with a Triton
  kernel (weight in bounded N chunks) and multiply with torch.matmul (cuBLAS): the per-group rescale
  inside a GEMM halves the tensor-core rate, a one-off dequant costs a few percent.
- No Hopper-only features (no TMA / wgmma-specific APIs): SM89/SM120 users run the same code.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from kernels_triton import _env
from kernels_triton._dispatch import use_triton
from kernels_triton.formats.codecs import expand_block_scales, unpack_ue8m0_int32

try:  # Triton is optional on the CPU path (the reference needs only torch).
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only on installs without triton
    _HAVE_TRITON = False
try:  # grid dependency control (programmatic dependent launch), Triton >= 3.4, SM90 and newer
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: the GEMV runs without PDL
    gdc_launch_dependents = gdc_wait = None

FP8_DTYPE = torch.float8_e4m3fn
_SMALL_M = 16  # the decode path: one 16-row tile covers the whole batch


# --------------------------------------------------------------------------------------------
# Scale helpers
# --------------------------------------------------------------------------------------------
def unpack_ue8m0_scales(sf: torch.Tensor, num_groups: int | None = None) -> torch.Tensor:
    """DeepGEMM packed UE8M0 scales -> float32.

    `sf` is int32 [..., mn, ceil(groups / 4)] (any strides: DeepGEMM keeps it MN-major and
    TMA-aligned); byte j of each int32 is the biased exponent e of group 4*i + j and the scale is
    2^(e - 127). Returns [..., mn, num_groups] float32 (contiguous).
    """
    e = unpack_ue8m0_int32(sf)  # [..., mn, 4 * packs], group order preserved
    out = torch.exp2(e.to(torch.float32) - 127.0)
    if num_groups is not None:
        out = out[..., :num_groups]
    return out.contiguous()


def _check(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
           block_size: tuple[int, int]) -> tuple[int, int, int, int, int]:
    bn, bk = int(block_size[0]), int(block_size[1])
    if a.dim() < 2 or a.dim() != b.dim():
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must have the same rank >= 2")
    m, k = a.shape[-2:]
    n, k2 = b.shape[-2:]
    if k != k2:
        raise ValueError(f"K mismatch: a {tuple(a.shape)} vs b {tuple(b.shape)}")
    kg = -(-k // bk)
    if tuple(a_scale.shape[-2:]) != (m, kg):
        raise ValueError(f"a_scale {tuple(a_scale.shape)} != (..., {m}, {kg}) for block_k {bk}")
    if tuple(b_scale.shape[-2:]) != (-(-n // bn), kg):
        raise ValueError(f"b_scale {tuple(b_scale.shape)} != (..., {-(-n // bn)}, {kg}) for {block_size}")
    return m, n, k, bn, bk


# --------------------------------------------------------------------------------------------
# Reference (plain torch): the CPU serving path and the test oracle's twin
# --------------------------------------------------------------------------------------------
def fp8_block_gemm_reference(a_fp8: torch.Tensor, a_scale: torch.Tensor, b_fp8: torch.Tensor,
                             b_scale: torch.Tensor, block_size: tuple[int, int],
                             out_dtype: torch.dtype = torch.bfloat16, *, out: torch.Tensor | None = None,
                             c: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantize to fp32 and matmul (see module docstring for layouts). Works on any device."""
    m, n, k, bn, bk = _check(a_fp8, a_scale, b_fp8, b_scale, block_size)
    a_deq = a_fp8.to(torch.float32) * expand_block_scales(a_scale, m, k, (1, bk))
    batch = a_fp8.shape[:-2]
    acc = torch.empty(*batch, m, n, dtype=torch.float32, device=a_fp8.device)
    # ~64 MiB of dequantized weight per chunk: bounded memory on the CPU serving path.
    chunk = max(bn, ((1 << 24) // max(k, 1)) // bn * bn)
    for n0 in range(0, n, chunk):
        n1 = min(n, n0 + chunk)
        sb = b_scale[..., n0 // bn: -(-n1 // bn), :]
        b_deq = b_fp8[..., n0:n1, :].to(torch.float32) * expand_block_scales(sb, n1 - n0, k, (bn, bk))
        acc[..., n0:n1] = torch.matmul(a_deq, b_deq.transpose(-1, -2))
    if c is not None:
        acc += c.to(torch.float32)
    if out is None:
        return acc.to(out_dtype)
    out.copy_(acc)
    return out


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------
if _HAVE_TRITON:

    @triton.jit
    def _round_bf16(x):
        """fp32 -> nearest-even bf16 value, kept in fp32 (interpreter stand-in for .to(bf16))."""
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _dequant_bf16_kernel(x_ptr, s_ptr, y_ptr, R, K, s_xr, s_xk, s_sr, s_sk,
                             GR: tl.constexpr, GK: tl.constexpr, BLOCK_R: tl.constexpr,
                             BLOCK_K: tl.constexpr, PER_GROUP: tl.constexpr, ROUND_BY_HAND: tl.constexpr):
        """y[r, k] = bf16(x[r, k] * s[r // GR, k // GK]) for a row-major bf16 y.

        PER_GROUP (GK divides BLOCK_K): one scale load per row and K group, broadcast over the group
        through a [BLOCK_R, BLOCK_K / GK, GK] view, instead of one gathered 4-byte load per element.
        """
        rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        msk = (rr < R)[:, None] & (kk < K)[None, :]
        x = tl.load(x_ptr + rr[:, None].to(tl.int64) * s_xr + kk[None, :] * s_xk, mask=msk, other=0.0)
        if PER_GROUP:
            KG: tl.constexpr = BLOCK_K // GK
            g = tl.program_id(1) * KG + tl.arange(0, KG)
            gmsk = (rr < R)[:, None] & (g * GK < K)[None, :]
            sc = tl.load(s_ptr + (rr // GR)[:, None] * s_sr + g[None, :] * s_sk, mask=gmsk, other=0.0)
            y3 = tl.reshape(x.to(tl.float32), (BLOCK_R, KG, GK)) * sc[:, :, None]
            y = tl.reshape(y3, (BLOCK_R, BLOCK_K))
        else:
            sc = tl.load(s_ptr + (rr // GR)[:, None] * s_sr + (kk // GK)[None, :] * s_sk, mask=msk, other=0.0)
            y = x.to(tl.float32) * sc
        if ROUND_BY_HAND:
            y = _round_bf16(y)
        tl.store(y_ptr + rr[:, None].to(tl.int64) * K + kk[None, :], y.to(tl.bfloat16), mask=msk)

    @triton.jit
    def _fp8_block_gemm_kernel(
        a_ptr, b_ptr, as_ptr, bs_ptr, c_ptr, d_ptr, ws_ptr, cnt_ptr,
        M, N, K, iters_per_split, split_k,
        s_ab, s_am, s_ak, s_bb, s_bn, s_bk,
        s_asb, s_asm, s_ask, s_bsb, s_bsn, s_bsk,
        s_cb, s_cm, s_cn, s_db, s_dm, s_dn,
        GN: tl.constexpr, GK: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        USE_SPLIT: tl.constexpr, GROUP_M: tl.constexpr,
        DEQUANT: tl.constexpr, UPCAST: tl.constexpr, HAS_C: tl.constexpr, F32_DOT: tl.constexpr,
    ):
        pid = tl.program_id(0)
        pid_k = tl.program_id(1)
        bat = tl.program_id(2).to(tl.int64)
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        # Grouped tile order: neighbouring CTAs share B columns in L2 (prefill).
        in_group = GROUP_M * num_pid_n
        first_m = (pid // in_group) * GROUP_M
        group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % group_m
        pid_n = (pid % in_group) // group_m

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_mask = offs_m < M
        n_mask = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        kg_total = tl.cdiv(K, GK)

        a_base = a_ptr + bat * s_ab + offs_m[:, None] * s_am
        b_base = b_ptr + bat * s_bb + offs_n[None, :] * s_bn
        as_base = as_ptr + bat * s_asb + offs_m * s_asm
        bs_base = bs_ptr + bat * s_bsb + (offs_n // GN) * s_bsn

        k_iters = tl.cdiv(K, BLOCK_K)
        it0 = pid_k * iters_per_split
        it1 = tl.minimum(it0 + iters_per_split, k_iters)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for it in range(it0, it1):
            kk = it * BLOCK_K + offs_k
            k_mask = kk < K
            a = tl.load(a_base + kk[None, :] * s_ak, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(b_base + kk[:, None] * s_bk, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
            if DEQUANT:
                # Tile K spans BLOCK_K // GK scale groups: scale both tiles in fp32 and multiply on
                # bf16 tensor cores (one rescale per element instead of one per output per group).
                KG: tl.constexpr = BLOCK_K // GK
                g = it * KG + tl.arange(0, KG)
                g_mask = g < kg_total
                sa = tl.load(as_base[:, None] + g[None, :] * s_ask, mask=m_mask[:, None] & g_mask[None, :],
                             other=0.0)
                sb = tl.load(bs_base[None, :] + g[:, None] * s_bsk, mask=g_mask[:, None] & n_mask[None, :],
                             other=0.0)
                sa_full = tl.reshape(tl.broadcast_to(sa[:, :, None], (BLOCK_M, KG, GK)), (BLOCK_M, BLOCK_K))
                sb_full = tl.reshape(tl.broadcast_to(sb[:, None, :], (KG, GK, BLOCK_N)), (BLOCK_K, BLOCK_N))
                a_f = a.to(tl.float32) * sa_full
                b_f = b.to(tl.float32) * sb_full
                if F32_DOT:
                    # Triton's interpreter mis-multiplies bf16 dots and truncates fp32 -> bf16:
                    # round to bf16 by hand (nearest-even, as the GPU does) and multiply in fp32
                    # (products of bf16 values are exact in fp32).
                    acc += tl.dot(_round_bf16(a_f), _round_bf16(b_f), out_dtype=tl.float32)
                else:
                    acc += tl.dot(a_f.to(tl.bfloat16), b_f.to(tl.bfloat16), out_dtype=tl.float32)
            else:
                # BLOCK_K == GK: exact FP8 products, one fp32 rescale per scale group.
                g = it
                sa = tl.load(as_base + g * s_ask, mask=m_mask, other=0.0)
                sb = tl.load(bs_base + g * s_bsk, mask=n_mask, other=0.0)
                if UPCAST:
                    a = a.to(tl.bfloat16)
                    b = b.to(tl.bfloat16)
                part = tl.dot(a, b, out_dtype=tl.float32)
                acc += part * sa[:, None] * sb[None, :]

        out_mask = m_mask[:, None] & n_mask[None, :]
        d_ptrs = d_ptr + bat * s_db + offs_m[:, None] * s_dm + offs_n[None, :] * s_dn
        if not USE_SPLIT:
            if HAS_C:
                acc += tl.load(c_ptr + bat * s_cb + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn,
                               mask=out_mask, other=0.0).to(tl.float32)
            tl.store(d_ptrs, acc.to(d_ptr.dtype.element_ty), mask=out_mask)
        else:
            # Split-K: write the fp32 partial, then the last CTA to arrive on this tile sums all
            # partials and writes the output (no second kernel launch on the decode path).
            num_tiles = num_pid_m * num_pid_n
            tile = (bat * num_tiles + pid_m * num_pid_n + pid_n)
            mn = M * N
            ws_tile = ws_ptr + bat * split_k * mn + offs_m[:, None] * N + offs_n[None, :]
            tl.store(ws_tile + pid_k * mn, acc, mask=out_mask)
            tl.debug_barrier()  # every warp's partial is issued before the release below
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == split_k - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(split_k):
                    # .cg: read through L2, not a stale L1 line, what the other CTAs wrote.
                    total += tl.load(ws_tile + s * mn, mask=out_mask, other=0.0, cache_modifier=".cg")
                if HAS_C:
                    total += tl.load(c_ptr + bat * s_cb + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn,
                                     mask=out_mask, other=0.0).to(tl.float32)
                tl.store(d_ptrs, total.to(d_ptr.dtype.element_ty), mask=out_mask)
                tl.atomic_xchg(cnt_ptr + tile, 0)  # self-reset: ready for the next call / graph replay


    @triton.jit
    def _fp8_gemv_x(a_row, kk, K, s_ak):
        """One activation row's fp8 x for one K step: [BLOCK_N, BLOCK_K] in the weight tile's layout when
        `a_row` holds one (equal) pointer per tile row, a [1, BLOCK_K] row when it is [1, 1] (X_ROW)."""
        return tl.load(a_row + kk[None, :] * s_ak, mask=(kk < K)[None, :], other=0.0)


    @triton.jit
    def _fp8_gemv_part(wf, x, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, VEC: tl.constexpr):
        """The [BLOCK_N, BLOCK_K] fp32 weight tile `wf` times one row's x, summed in-thread over
        VEC-wide chunks -> unscaled [BLOCK_N, BLOCK_K / VEC] partials."""
        return tl.sum(tl.reshape(wf * x.to(tl.float32), (BLOCK_N, BLOCK_K // VEC, VEC)), axis=2)


    @triton.jit
    def _fp8_gemv_step(w, x_rows, as_ptr, bs_row, it, K, s_am, s_ak, s_asm, s_ask, s_bsk,
                       acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7,
                       ROWS: tl.constexpr, GK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       VEC: tl.constexpr):
        """One K step of `_fp8_gemv_kernel` on its loaded fp8 weight tile `w`: converts it to fp32 once
        and adds each activation row's scaled partials to that row's accumulator (acc<r> for row
        r < ROWS; the others pass through untouched and are compiled away).

        Row 0 keeps the order of the former M = 1 kernel, which gives the same PTX: x loaded before
        the weight is converted, the scales loaded after the partial sums. A version that converted
        the weight first and loaded the weight scales first was 0.9 us slower on 5120x4096 (H200)."""
        kk = it * BLOCK_K + tl.arange(0, BLOCK_K)
        x = _fp8_gemv_x(x_rows, kk, K, s_ak)
        wf = w.to(tl.float32)
        part = _fp8_gemv_part(wf, x, BLOCK_N, BLOCK_K, VEC)
        kc = it * BLOCK_K + tl.arange(0, BLOCK_K // VEC) * VEC
        c_mask = kc < K
        g = kc // GK
        sa = tl.load(as_ptr + g * s_ask, mask=c_mask, other=0.0)
        sb = tl.load(bs_row + g * s_bsk, mask=c_mask, other=0.0)
        acc0 += part * (sa * sb)[None, :]
        if ROWS > 1:
            part = _fp8_gemv_part(wf, _fp8_gemv_x(x_rows + s_am, kk, K, s_ak), BLOCK_N, BLOCK_K, VEC)
            acc1 += part * (tl.load(as_ptr + s_asm + g * s_ask, mask=c_mask, other=0.0) * sb)[None, :]
        if ROWS > 2:
            part = _fp8_gemv_part(wf, _fp8_gemv_x(x_rows + 2 * s_am, kk, K, s_ak), BLOCK_N, BLOCK_K, VEC)
            acc2 += part * (tl.load(as_ptr + 2 * s_asm + g * s_ask, mask=c_mask, other=0.0) * sb)[None, :]
        if ROWS > 3:
            part = _fp8_gemv_part(wf, _fp8_gemv_x(x_rows + 3 * s_am, kk, K, s_ak), BLOCK_N, BLOCK_K, VEC)
            acc3 += part * (tl.load(as_ptr + 3 * s_asm + g * s_ask, mask=c_mask, other=0.0) * sb)[None, :]
        if ROWS > 4:
            part = _fp8_gemv_part(wf, _fp8_gemv_x(x_rows + 4 * s_am, kk, K, s_ak), BLOCK_N, BLOCK_K, VEC)
            acc4 += part * (tl.load(as_ptr + 4 * s_asm + g * s_ask, mask=c_mask, other=0.0) * sb)[None, :]
        if ROWS > 5:
            part = _fp8_gemv_part(wf, _fp8_gemv_x(x_rows + 5 * s_am, kk, K, s_ak), BLOCK_N, BLOCK_K, VEC)
            acc5 += part * (tl.load(as_ptr + 5 * s_asm + g * s_ask, mask=c_mask, other=0.0) * sb)[None, :]
        if ROWS > 6:
            part = _fp8_gemv_part(wf, _fp8_gemv_x(x_rows + 6 * s_am, kk, K, s_ak), BLOCK_N, BLOCK_K, VEC)
            acc6 += part * (tl.load(as_ptr + 6 * s_asm + g * s_ask, mask=c_mask, other=0.0) * sb)[None, :]
        if ROWS > 7:
            part = _fp8_gemv_part(wf, _fp8_gemv_x(x_rows + 7 * s_am, kk, K, s_ak), BLOCK_N, BLOCK_K, VEC)
            acc7 += part * (tl.load(as_ptr + 7 * s_asm + g * s_ask, mask=c_mask, other=0.0) * sb)[None, :]
        return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


    @triton.jit
    def _fp8_gemv_prefetch_l2(w_rows, n_mask, it, K, s_bk, BLOCK_K: tl.constexpr):
        """Ask L2 for one K step's weight tile without waiting for it (PTX `prefetch.global.L2`, one
        per 128-byte line of each tile row; lines past K re-touch the row's first line instead). Every
        tile row must lie inside the weight: `_l2_prefetch_steps` turns prefetching off otherwise."""
        LINE: tl.constexpr = 128 if BLOCK_K >= 128 else BLOCK_K
        kl = it * BLOCK_K + tl.arange(0, BLOCK_K // LINE) * LINE
        ok = n_mask[:, None] & (kl < K)[None, :]
        ptrs = tl.where(ok, w_rows + kl[None, :] * s_bk, w_rows)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _fp8_gemv_prefetch_steps(w_rows, n_mask, first, last, K, s_bk, BLOCK_K: tl.constexpr):
        """`_fp8_gemv_prefetch_l2` for K steps first .. last - 1."""
        for p in range(first, last):
            _fp8_gemv_prefetch_l2(w_rows, n_mask, p, K, s_bk, BLOCK_K)

    @triton.jit
    def _fp8_gemv_row_out(acc, row: tl.constexpr, c_ptr, d_ptr, ws_ptr, offs_n, n_mask, pid_k, ROWS: tl.constexpr,
                          N, s_cm, s_cn, s_dm, s_dn, USE_SPLIT: tl.constexpr, HAS_C: tl.constexpr):
        """Row `row`'s result of `_fp8_gemv_kernel`: with split-K its partial into the workspace, else
        (+ c) into the output."""
        res = tl.sum(acc, axis=1)
        if USE_SPLIT:
            tl.store(ws_ptr + (pid_k * ROWS + row) * N + offs_n, res, mask=n_mask)
        else:
            if HAS_C:
                res += tl.load(c_ptr + row * s_cm + offs_n * s_cn, mask=n_mask, other=0.0).to(tl.float32)
            tl.store(d_ptr + row * s_dm + offs_n * s_dn, res.to(d_ptr.dtype.element_ty), mask=n_mask)


    @triton.jit
    def _fp8_gemv_kernel(
        a_ptr, b_ptr, as_ptr, bs_ptr, c_ptr, d_ptr, ws_ptr, cnt_ptr,
        N, K, iters_per_split, split_k,
        s_am, s_ak, s_bn, s_bk, s_asm, s_ask, s_bsn, s_bsk, s_cm, s_cn, s_dm, s_dn,
        ROWS: tl.constexpr, GN: tl.constexpr, GK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        VEC: tl.constexpr, USE_SPLIT: tl.constexpr, HAS_C: tl.constexpr, PDL: tl.constexpr,
        X_ROW: tl.constexpr, L2_PREFETCH: tl.constexpr,
    ):
        """Decode GEMV without tensor cores for ROWS = M (1..8) activation rows:
        out[m, n] = sum_k w[n, k] * x[m, k] * sa[m, k/GK] * sb[n/GN, k/GK].

        Why it looks like this (H200 analysis in scripts/bench/RESULTS.md: "GEMV rework", 2026-11-29,
        ca8075b; the rows in "FP8 GEMV for 2..8 rows", 2026-12-01, 0b9624e; x as one row in "FP8 GEMV
        with x as one row", 2026-12-01, 541167f):
        - No tl.dot: at M = 1 an MMA wastes 15/16 of its rows and routes the weight through a
          dot-operand layout; a multiply-add streams the fp8 tile from 16-byte vector loads.
        - In-thread partial sums: the product tile is viewed as [BLOCK_N, BLOCK_K / VEC, VEC] and
          summed over the last axis, which the blocked layout keeps inside one thread (VEC = the
          16 bytes of one vector load). The accumulator is then [BLOCK_N, BLOCK_K / VEC] (2 fp32
          registers per thread at 8 x 1024) instead of one fp32 per loaded byte, so registers go to
          loads in flight rather than to the accumulator.
        - Rows: each weight tile is converted to fp32 once and then multiplied with each row of x in
          turn, one 2-D accumulator per row (acc0..acc7, unrolled at compile time). With x as one
          row (below) an added row costs ~10-20 us over a V4.1-Flash layer on the H200 (M = 1 67 us,
          M = 2 78 us, M = 4 108 us), so the defaults use it up to 6 rows where it beat the tl.dot
          path (GEMV_TUNED).
        - Scales after the partial sum: a VEC chunk lies inside one K scale group (GK % VEC == 0)
          and the tile's rows share one weight-scale row (GN % BLOCK_N == 0), so activation and
          weight scales multiply the [BLOCK_N, BLOCK_K / VEC] partials (1/VEC of the work).
        - x as one row (X_ROW, GemvConfig.x_row; every tuned default): x is loaded as one
          [1, BLOCK_K] row per K step and broadcast over the tile. Without it x is loaded in the
          weight tile's own 2-D layout, one load and one fp8 conversion of x per tile row a thread
          holds (Triton emits both as inline asm, which LLVM does not merge), which made each added
          activation row cost about as much as the weight's own conversion (~29 us per row per
          layer). X_ROW suits tiles whose warps lie along K (each thread holds whole tile rows);
          where warps lie along N it adds a shared-memory layout change and a CTA barrier per step,
          so the 8 x 512 / 8-warp rule for untuned short rows keeps the 2-D layout.
        - No software pipelining: Triton does not pipeline loads that do not feed a tl.dot, and a
          hand-written register double buffer (next K step's tile loaded before this step's math)
          was slower in every H200 sweep cell (more registers, byte shuffles); occupancy (about 32
          registers per thread at M = 1) keeps the loads in flight instead.
        - PDL (programmatic dependent launch, SM90+): the small shapes pay a fixed ~2-3 us per
          launch (ramp-up, tail). The weight does not depend on the previous kernel, so with PDL the
          kernel lets its successor launch at once, loads its first weight tile, and only then
          waits for the previous kernel (griddepcontrol.wait) before touching x, the scales or the
          output: the weight stream of one GEMV overlaps the tail of the one before.
        - L2_PREFETCH (GemvConfig.l2_prefetch, GPU only: inline PTX the interpreter cannot run): asks
          L2 for the weight of the next L2_PREFETCH K steps (`prefetch.global.L2`, before the PDL
          wait) and keeps that distance in the loop. It lost on most tiles (more requests in flight
          than DRAM needs, e.g. 25600x6144 38 -> 46 us) and won on 1792x5120 with 2 K steps (5.2 ->
          4.1 us). On single-step tiles it prefetches nothing, yet it timed faster in every H200 run
          with PDL (5120x4096 7.1 -> 6.4 us, 2304x5120 5.5 -> 5.1): only the code before the wait
          differs (the empty prefetch loop; same registers), a cause not understood. GEMV_TUNED
          uses 2 on those three shapes only.
        """
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        srow = (pid_n * BLOCK_N) // GN  # the one weight-scale row of this tile
        k_iters = tl.cdiv(K, BLOCK_K)
        it0 = pid_k * iters_per_split
        it1 = tl.minimum(it0 + iters_per_split, k_iters)
        w_rows = b_ptr + offs_n.to(tl.int64)[:, None] * s_bn
        if X_ROW:  # one [1, BLOCK_K] row of x per step (GemvConfig.x_row)
            x_rows = a_ptr + tl.zeros((1, 1), dtype=tl.int32)
        else:  # x broadcast over the tile's rows, in the weight tile's own layout
            x_rows = a_ptr + offs_n[:, None] * 0
        bs_row = bs_ptr + srow * s_bsn
        acc0 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
        acc3 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
        acc4 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
        acc5 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
        acc6 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
        acc7 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
        start = it0
        if PDL:
            gdc_launch_dependents()
            kk = it0 * BLOCK_K + offs_k
            w = tl.load(w_rows + kk[None, :] * s_bk, mask=n_mask[:, None] & (kk < K)[None, :], other=0.0)
            if L2_PREFETCH > 0:  # more of the weight on its way while the previous kernel finishes
                _fp8_gemv_prefetch_steps(w_rows, n_mask, it0 + 1, tl.minimum(it0 + 1 + L2_PREFETCH, it1), K, s_bk,
                                         BLOCK_K)
            gdc_wait()  # the previous kernel's writes (x, its scales, our output buffer) are visible now
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _fp8_gemv_step(
                w, x_rows, as_ptr, bs_row, it0, K, s_am, s_ak, s_asm, s_ask, s_bsk,
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, ROWS, GK, BLOCK_N, BLOCK_K, VEC)
            start = it0 + 1
        elif L2_PREFETCH > 0:
            _fp8_gemv_prefetch_steps(w_rows, n_mask, it0 + 1, tl.minimum(it0 + 1 + L2_PREFETCH, it1), K, s_bk, BLOCK_K)
        for it in range(start, it1):
            if L2_PREFETCH > 0:  # keep L2_PREFETCH steps ahead of the loads in flight
                if (it > it0) & (it + L2_PREFETCH < it1):
                    _fp8_gemv_prefetch_l2(w_rows, n_mask, it + L2_PREFETCH, K, s_bk, BLOCK_K)
            kk = it * BLOCK_K + offs_k
            w = tl.load(w_rows + kk[None, :] * s_bk, mask=n_mask[:, None] & (kk < K)[None, :], other=0.0)
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _fp8_gemv_step(
                w, x_rows, as_ptr, bs_row, it, K, s_am, s_ak, s_asm, s_ask, s_bsk,
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, ROWS, GK, BLOCK_N, BLOCK_K, VEC)
        _fp8_gemv_row_out(acc0, 0, c_ptr, d_ptr, ws_ptr, offs_n, n_mask, pid_k, ROWS, N, s_cm, s_cn, s_dm, s_dn,
                          USE_SPLIT, HAS_C)
        if ROWS > 1:
            _fp8_gemv_row_out(acc1, 1, c_ptr, d_ptr, ws_ptr, offs_n, n_mask, pid_k, ROWS, N, s_cm, s_cn, s_dm, s_dn,
                              USE_SPLIT, HAS_C)
        if ROWS > 2:
            _fp8_gemv_row_out(acc2, 2, c_ptr, d_ptr, ws_ptr, offs_n, n_mask, pid_k, ROWS, N, s_cm, s_cn, s_dm, s_dn,
                              USE_SPLIT, HAS_C)
        if ROWS > 3:
            _fp8_gemv_row_out(acc3, 3, c_ptr, d_ptr, ws_ptr, offs_n, n_mask, pid_k, ROWS, N, s_cm, s_cn, s_dm, s_dn,
                              USE_SPLIT, HAS_C)
        if ROWS > 4:
            _fp8_gemv_row_out(acc4, 4, c_ptr, d_ptr, ws_ptr, offs_n, n_mask, pid_k, ROWS, N, s_cm, s_cn, s_dm, s_dn,
                              USE_SPLIT, HAS_C)
        if ROWS > 5:
            _fp8_gemv_row_out(acc5, 5, c_ptr, d_ptr, ws_ptr, offs_n, n_mask, pid_k, ROWS, N, s_cm, s_cn, s_dm, s_dn,
                              USE_SPLIT, HAS_C)
        if ROWS > 6:
            _fp8_gemv_row_out(acc6, 6, c_ptr, d_ptr, ws_ptr, offs_n, n_mask, pid_k, ROWS, N, s_cm, s_cn, s_dm, s_dn,
                              USE_SPLIT, HAS_C)
        if ROWS > 7:
            _fp8_gemv_row_out(acc7, 7, c_ptr, d_ptr, ws_ptr, offs_n, n_mask, pid_k, ROWS, N, s_cm, s_cn, s_dm, s_dn,
                              USE_SPLIT, HAS_C)
        if USE_SPLIT:
            # Split-K: the last CTA to arrive on this N tile sums the partials in split order
            # (deterministic) and writes the output; the counter resets itself (graph-safe).
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == split_k - 1:
                for row in tl.static_range(ROWS):
                    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
                    for s in range(split_k):
                        total += tl.load(ws_ptr + (s * ROWS + row) * N + offs_n, mask=n_mask, other=0.0,
                                         cache_modifier=".cg")
                    if HAS_C:
                        total += tl.load(c_ptr + row * s_cm + offs_n * s_cn, mask=n_mask, other=0.0).to(tl.float32)
                    tl.store(d_ptr + row * s_dm + offs_n * s_dn, total.to(d_ptr.dtype.element_ty), mask=n_mask)
                tl.atomic_xchg(cnt_ptr + pid_n, 0)


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One launch configuration (block sizes in elements)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    dequant: bool
    group_m: int = 8


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """Launch configuration of the GEMV kernel (`_fp8_gemv_kernel`).

    pdl: launch with programmatic dependent launch where the GPU supports it; None lets
    `gemv_pdl`'s shape rule decide.
    x_row: load each activation row as one [1, block_k] row per K step, broadcast over the tile,
    instead of in the weight tile's 2-D layout (one copy per tile row a thread holds, each loaded
    and converted from fp8 again). Where the tile's warps all lie along K (rows held in-thread,
    e.g. 2 x 4096 with 4 warps) that removes the copies without a layout change; where warps lie
    along N it adds a shared-memory layout change per row and step. Every GEMV_TUNED entry uses it.
    l2_prefetch: K steps of weight requested into L2 ahead of the loads (0: none; GPU only, the
    interpreter runs without it); `_fp8_gemv_kernel`'s docstring says where it pays."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    pdl: bool | None = None
    x_row: bool = False
    l2_prefetch: int = 0


_COUNTER_SLOTS = 1 << 16


@functools.cache
def _counters(device: torch.device) -> torch.Tensor:
    """Per-device arrival counters for the split-K epilogue; zero at rest (each use resets)."""
    return torch.zeros(_COUNTER_SLOTS, dtype=torch.int32, device=device)


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _pdl_supported(device: torch.device) -> bool:
    """Whether this GPU and Triton can launch with programmatic dependent launch: SM90 or newer (the
    users' SM120 included), a Triton with grid dependency control and the `launch_pdl` option."""
    if not _HAVE_TRITON or gdc_wait is None or device.type != "cuda":
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover - a Triton build without the NVIDIA backend
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {}) and \
        torch.cuda.get_device_capability(device) >= (9, 0)


def gemv_pdl(device: torch.device, k: int, tiles: int, choice: bool | None = None) -> bool:
    """Whether the M = 1 GEMV over K columns in `tiles` N tiles launches with PDL on `device`.

    Where supported (`_pdl_supported`): `choice` when the config says (GemvConfig.pdl), else for
    short rows (K <= 2048) or grids of >= 8 CTAs per SM. With the 8-row default tiles the H200 run
    of 2026-11-30 (scripts/bench/RESULTS.md "Every GPU op test, ... programmatic dependent launch",
    97307d4) timed PDL faster there (25600x6144
    42.5 -> 40.3 us, 16384x1280 9.2 -> 8.3, 4096x1280 4.1 -> 3.2, 5120x1152 equal) and slower on the
    long rows of the small grids (5120x4096 8.7 -> 10.4, 2304x5120 7.6 -> 8.9, 1792x5120 6.6 -> 8.3),
    which GEMV_TUNED now gives other tiles. WINPORT_FP8_GEMV_PDL=0 turns it off, =force on
    wherever supported (the benchmark's switches)."""
    env = _env.WINPORT_FP8_GEMV_PDL.get()
    if env == "off" or not _pdl_supported(device):
        return False
    if env == "force":
        return True
    return choice if choice is not None else (k <= 2048 or tiles >= 8 * _num_sms(device))


@functools.cache
def _has_fp8_mma(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 9)


def default_config(m: int, n: int, k: int, bn: int, bk: int, device: torch.device,
                   batch: int = 1) -> GemmConfig:
    """Heuristic launch configuration (tuned on the H200 with scripts/bench/gemm.py).

    Decode: a 16-row tile, wide N tiles and enough K splits for ~4 waves of CTAs so the whole
    weight streams at copy bandwidth. Prefill: 128 x 128 tiles; groups smaller than 64 use the
    DEQUANT mode so the tensor-core K step stays 64 wide.
    """
    env = _env.WINPORT_FP8_GEMM_CONFIG.get()  # bench/tuning override: "bm,bn,bk,split,w,s,dq"
    if env:
        f = env
        return GemmConfig(f[0], f[1], f[2], f[3], f[4], f[5], bool(f[6]))
    fp8_ok = device.type != "cuda" or _has_fp8_mma(device)
    if m <= _SMALL_M:
        if fp8_ok and bk >= 128:
            block_k, dequant = bk, False
        else:  # small groups (V4.1's 32): 128-wide K steps, scales applied while dequantizing
            block_k, dequant = max(bk, 128), True
        block_n = 64
        k_iters = -(-k // block_k)
        tiles = -(-n // block_n) * batch
        sms = _num_sms(device) if device.type == "cuda" else 1
        split = max(1, min(k_iters, (4 * sms) // max(tiles, 1), 16))
        return GemmConfig(16, block_n, block_k, split, 4, 4, dequant, 1)
    block_m = 64 if m <= 64 else 128
    if bk >= 64 and fp8_ok:
        # H200 sweep (scripts/bench/RESULTS.md "FP8 block-scaled GEMV / GEMM", 2026-11-29, 07a46e6):
        # 64 x 128 tiles, 4 warps, 4 stages won on all 7 shapes.
        return GemmConfig(64, 128, bk, 1, 4, 4, False)
    return GemmConfig(block_m, 128, max(64, bk), 1, 8 if block_m == 128 else 4, 3, True)


GEMV_MAX_M = 8  # activation rows the tensor-core-free GEMV kernel takes (with an explicit GemvConfig)
# Untuned shapes take the GEMV kernel up to this many rows by default, the tl.dot split-K path above.
GEMV_ROWS_DEFAULT_MAX_M = 3


def _tuned(block_n: int, block_k: int, warps: int, l2_prefetch: int = 0) -> GemvConfig:
    """A GEMV_TUNED entry: one split (the split rule still applies), x as one row, PDL on."""
    return GemvConfig(block_n, block_k, split_k=1, num_warps=warps, num_stages=1, pdl=True, x_row=True,
                      l2_prefetch=l2_prefetch)


# (N, K) -> {M: GemvConfig, or None for the tl.dot split-K path}: the V4.1-Flash dense shapes, from the
# H200 sweeps of 2026-12-01 (scripts/bench/gemm.py --rows-sweep --rows-m ... --rows-tiles ...; RESULTS.md
# "FP8 GEMV with x as one row", 2026-12-01, H200, 541167f). Each entry is that sweep's best tile with x loaded as one row and PDL on
# (PDL timed equal or faster than without for every shape and M). The comments give us per call in those runs,
# [the former default], {the tl.dot path}. M missing (and M >= 7): the tl.dot path, which costs about the
# same at every M (~143 us per layer), while the GEMV kernel's multiply-adds on CUDA cores grow with each
# row; a GEMV tile stays only where it beat tl.dot by >= 5%. l2_prefetch = 2: on 1792x5120 (two K steps)
# it prefetches the second; on the single-K-step tiles of 5120x4096 and 2304x5120 it prefetches nothing,
# yet was faster in every run that timed both, through the code it adds before the PDL wait (RESULTS.md;
# the cause is not understood).
GEMV_TUNED: dict[tuple[int, int], dict[int, GemvConfig | None]] = {
    (25600, 6144): {1: _tuned(8, 2048, 4),  # 38.9 [39.8]
                    2: _tuned(4, 2048, 4), 3: _tuned(8, 1024, 2),  # 43.0 [54.6], 50.5 [72.7]
                    4: _tuned(4, 512, 1)},  # 60.5 {78.4}; M = 5: 77.9 {79.0}
    (16384, 1280): {1: _tuned(8, 512, 1), 2: _tuned(8, 512, 1),  # 7.6 [8.1], 7.9 [10.4]
                    3: _tuned(8, 512, 1), 4: _tuned(4, 512, 1)},  # 9.3 {13.3}, 11.9 {13.6}
    (5120, 4096): {1: _tuned(2, 4096, 4, 2), 2: _tuned(2, 2048, 2),  # 6.7 [7.3], 8.5 [9.7]
                   3: _tuned(2, 1024, 1), 4: _tuned(4, 2048, 4),  # 9.9 [12.2], 10.9 {14.7}
                   5: _tuned(4, 512, 1)},  # 13.2 {14.8}
    (4096, 1280): {1: _tuned(4, 2048, 4), 2: _tuned(4, 2048, 4),  # 3.1 [3.2], 3.6 [4.9]
                   3: _tuned(4, 1024, 2), 4: _tuned(2, 512, 1),  # 4.2 {7.7}, 5.1 [6.7]
                   5: _tuned(4, 512, 1), 6: _tuned(4, 512, 1)},  # 5.6 {7.7}, 6.4 {7.7}
    (5120, 1152): {1: _tuned(4, 2048, 4), 2: _tuned(8, 2048, 4),  # 3.2 [3.7], 4.8 [5.0]
                   3: _tuned(4, 512, 1), 4: _tuned(4, 512, 1),  # 5.0 [5.6], 5.7 [7.4]
                   5: _tuned(4, 512, 1)},  # 5.7 {7.8}
    (2304, 5120): {1: _tuned(2, 8192, 8, 2), 2: _tuned(4, 2048, 4),  # 5.1 [5.5], 6.2 [8.2]
                   3: _tuned(2, 2048, 2), 4: _tuned(8, 2048, 4),  # 7.6 [10.3], 8.6 {11.3}
                   5: _tuned(4, 1024, 2)},  # 9.1 {11.3}
    (1792, 5120): {1: _tuned(8, 4096, 8, 2), 2: _tuned(2, 4096, 4),  # 4.3 [6.4], 5.7 [6.9]
                   3: _tuned(4, 2048, 4), 4: _tuned(8, 2048, 4),  # 5.6 [8.7], 8.2 {10.0}
                   5: _tuned(8, 2048, 4), 6: _tuned(4, 2048, 4)},  # 8.1 {9.9}, 8.6 {10.0}
}


def default_gemv_config(n: int, k: int, bn: int, device: torch.device, m: int = 1) -> GemvConfig | None:
    """Default config of the GEMV kernel, or None where the defaults take the tl.dot path instead
    (scale rows narrower than 8, or more rows than the GEMV kernel wins at).

    The V4.1-Flash dense shapes: GEMV_TUNED (M = 1..6; missing M -> tl.dot). Other shapes, from the H200
    sweeps (RESULTS.md "GEMV rework", 2026-11-29, ca8075b, and "FP8 GEMV with x as one row", 2026-12-01,
    541167f): M = 1 8-row N tiles,
    K >= 4608 -> 2048-wide K steps, 4 warps, x as one row; else 512-wide steps with 8 warps (warps
    along N, where x as one row needs a layout change); M = 2 and 3 4 x 2048 tiles, 4 warps, x as one
    row (the best mean over the seven shapes at M = 2 and 3); more rows -> tl.dot. PDL by `gemv_pdl`'s
    rule. No split-K (the arrival-counter epilogue cost more than it gained on every shape) except
    where the N tiles alone leave SMs idle (fewer tiles than SMs; counted in SMs, so SM120 parts get
    proportionate grids).
    """
    env = _env.WINPORT_FP8_GEMV_CONFIG.get()  # bench/tuning override: "bn,bk,split,warps,stages"
    if env:
        return GemvConfig(*env)
    if bn < 8 or bn % 8:
        return None
    per_m = GEMV_TUNED.get((n, k))
    if per_m is not None:
        cfg = per_m.get(m)
        if cfg is None:
            return None
    elif m > GEMV_ROWS_DEFAULT_MAX_M:
        return None
    elif m == 1:
        cfg = (GemvConfig(8, 2048, split_k=1, num_warps=4, num_stages=1, x_row=True) if k >= 4608
               else GemvConfig(8, 512, split_k=1, num_warps=8, num_stages=1))
    else:
        cfg = GemvConfig(4, 2048, split_k=1, num_warps=4, num_stages=1, x_row=True)
    block_k = min(cfg.block_k, max(64, triton.next_power_of_2(k)))
    tiles = -(-n // cfg.block_n)
    k_iters = -(-k // block_k)
    sms = _num_sms(device) if device.type == "cuda" else 4
    split = 1 if tiles >= sms else max(1, min(k_iters, -(-2 * sms // tiles)))
    return dataclasses.replace(cfg, block_k=block_k, split_k=split)


def _l2_prefetch_steps(cfg: GemvConfig, n: int) -> int:
    """The kernel's L2_PREFETCH for `cfg` on an N-row weight: cfg.l2_prefetch, but 0 under Triton's
    interpreter (it cannot run the inline PTX) and when block_n does not divide N (the last tile's
    rows past N would be prefetched from outside the weight; a hint only, so it is dropped)."""
    if _env.interpreting() or n % cfg.block_n:
        return 0
    return max(0, cfg.l2_prefetch)


def _fp8_gemv_triton(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                     bn: int, bk: int, out: torch.Tensor, c: torch.Tensor | None, cfg: GemvConfig) -> torch.Tensor:
    """Launch `_fp8_gemv_kernel` for a [M, K] activation, 1 <= M <= GEMV_MAX_M (2-D operands only),
    compiled for exactly M rows."""
    m = a.shape[0]
    n, k = b.shape
    if bn % cfg.block_n:
        raise ValueError(f"GEMV block_n {cfg.block_n} must divide the weight scale block {bn}")
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"the GEMV kernels take 1..{GEMV_MAX_M} activation rows, got {m}")
    # In-thread partial sums over VEC-wide chunks (a 16-byte fp8 vector) that never straddle a
    # K scale group: VEC = the largest power of two dividing both 16 and the group size.
    vec = math.gcd(16, bk, cfg.block_k)
    k_iters = -(-k // cfg.block_k)
    tiles = -(-n // cfg.block_n)
    split = max(1, min(cfg.split_k, k_iters))
    if split > 1 and tiles > _COUNTER_SLOTS:
        split = 1
    per = -(-k_iters // split)
    split = -(-k_iters // per)  # no empty splits
    ws = torch.empty(split * m * n if split > 1 else 1, dtype=torch.float32, device=a.device)
    cnt = _counters(a.device) if split > 1 else ws
    c_arg = c if c is not None else out
    pdl = gemv_pdl(a.device, k, tiles, cfg.pdl)
    _fp8_gemv_kernel[(tiles, split)](
        a, b, a_scale, b_scale, c_arg, out, ws, cnt,
        n, k, per, split,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), a_scale.stride(0), a_scale.stride(1),
        b_scale.stride(0), b_scale.stride(1), c.stride(0) if c is not None else 0,
        c.stride(1) if c is not None else 0, out.stride(0), out.stride(1),
        ROWS=m, GN=bn, GK=bk, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, VEC=vec,
        USE_SPLIT=split > 1, HAS_C=c is not None, PDL=pdl, X_ROW=cfg.x_row,
        L2_PREFETCH=_l2_prefetch_steps(cfg, n),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if pdl else {}),
    )
    return out


def _fp8_block_gemm_triton(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                           bn: int, bk: int, out: torch.Tensor, c: torch.Tensor | None,
                           cfg: GemmConfig | None) -> torch.Tensor:
    m, k = a.shape[-2:]
    n = b.shape[-2]
    batch = 1
    if a.dim() == 3:
        batch = a.shape[0]
    elif a.dim() != 2:
        raise ValueError("the Triton path supports at most one batch dimension")
    if cfg is None:
        cfg = default_config(m, n, k, bn, bk, a.device, batch)
    if cfg.dequant and cfg.block_k % bk:
        raise ValueError(f"block_k {cfg.block_k} must be a multiple of the scale group {bk}")
    if not cfg.dequant and cfg.block_k != bk:
        raise ValueError("the FP8-dot mode needs block_k == scale group")
    num_tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    k_iters = -(-k // cfg.block_k)
    split = max(1, min(cfg.split_k, k_iters))
    if split > 1 and num_tiles * batch > _COUNTER_SLOTS:
        split = 1
    iters_per_split = -(-k_iters // split)
    split = -(-k_iters // iters_per_split)  # no empty splits
    upcast = not _has_fp8_mma(a.device) if a.is_cuda else False

    def s3(t: torch.Tensor | None) -> tuple[int, int, int]:
        if t is None:
            return (0, 0, 0)
        return (t.stride(0), t.stride(1), t.stride(2)) if t.dim() == 3 else (0, t.stride(0), t.stride(1))

    ws = torch.empty(batch * split * m * n if split > 1 else 1, dtype=torch.float32, device=a.device)
    cnt = _counters(a.device) if split > 1 else ws
    grid = (num_tiles, split, batch)
    _fp8_block_gemm_kernel[grid](
        a, b, a_scale, b_scale, c if c is not None else out, out, ws, cnt,
        m, n, k, iters_per_split, split,
        *s3(a), *s3(b), *s3(a_scale), *s3(b_scale), *s3(c), *s3(out),
        GN=bn, GK=bk, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        USE_SPLIT=split > 1, GROUP_M=cfg.group_m, DEQUANT=cfg.dequant, UPCAST=upcast, HAS_C=c is not None,
        F32_DOT=_env.interpreting(),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def dequant_bf16(x: torch.Tensor, s: torch.Tensor, gr: int, gk: int) -> torch.Tensor:
    """Triton: fp8 [R, K] with block scales [ceil(R/gr), ceil(K/gk)] -> bf16 [R, K] (row-major)."""
    r, k = x.shape
    y = torch.empty(r, k, dtype=torch.bfloat16, device=x.device)
    block_k = 256 if k >= 256 else 128
    per_group = gk & (gk - 1) == 0 and block_k % gk == 0  # power-of-two group inside one tile
    grid = (triton.cdiv(r, 32), triton.cdiv(k, block_k))
    _dequant_bf16_kernel[grid](x, s, y, r, k, x.stride(0), x.stride(1), s.stride(0), s.stride(1), GR=gr, GK=gk,
                               BLOCK_R=32, BLOCK_K=block_k, PER_GROUP=per_group,
                               ROUND_BY_HAND=_env.interpreting(), num_warps=4)
    return y


# Prefill with small scale groups (V4.1's 32): per-group rescaling inside the GEMM costs about half
# the tensor-core rate, so for large M the operands are dequantized to bf16 once (weight in N chunks,
# bounded memory) and multiplied by cuBLAS. Same numerics as the DEQUANT mode (bf16 operands).
DEQUANT_MATMUL_MIN_M = 256
_DEQUANT_CHUNK_ELEMS = 1 << 26  # 128 MiB of bf16 weight at most


def _dequant_matmul(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                    bn: int, bk: int, out: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
    n, k = b.shape
    a_bf = dequant_bf16(a, a_scale, 1, bk)
    rows = max(bn, (_DEQUANT_CHUNK_ELEMS // max(k, 1)) // bn * bn)
    for n0 in range(0, n, rows):
        n1 = min(n, n0 + rows)
        w_bf = dequant_bf16(b[n0:n1], b_scale[n0 // bn: -(-n1 // bn)], bn, bk)
        if c is None and n1 - n0 == n and out.is_contiguous():
            torch.matmul(a_bf, w_bf.t(), out=out)  # one chunk: cuBLAS writes the output directly
            break
        res = torch.matmul(a_bf, w_bf.t())
        if c is not None:
            res = res.float() + c[:, n0:n1].float()
        out[:, n0:n1].copy_(res)
    return out


def _use_triton(t: torch.Tensor) -> bool:
    return _HAVE_TRITON and use_triton(t)


def fp8_block_gemm(a_fp8: torch.Tensor, a_scale: torch.Tensor, b_fp8: torch.Tensor, b_scale: torch.Tensor,
                   block_size: tuple[int, int] | list[int], out_dtype: torch.dtype = torch.bfloat16, *,
                   out: torch.Tensor | None = None, c: torch.Tensor | None = None,
                   config: GemmConfig | GemvConfig | None = None) -> torch.Tensor:
    """Block-scaled FP8 GEMM `out = dequant(a) @ dequant(b)^T (+ c)`; layouts in the module docstring.

    Dispatch (kernels_triton._dispatch.use_triton): CUDA tensors -> Triton kernel; otherwise the torch reference.
    `out`, when given, is written in place (any strides) and returned. With 2-D operands, M = 1..3
    (and up to 6 rows where GEMV_TUNED says so) use the tensor-core-free GEMV kernel when the
    weight scale block is a multiple of 8 rows; an explicit `GemvConfig` selects it for any
    M <= GEMV_MAX_M.
    """
    bs = (int(block_size[0]), int(block_size[1]))
    m, n, _, _, _ = _check(a_fp8, a_scale, b_fp8, b_scale, bs)
    if a_scale.dtype != torch.float32 or b_scale.dtype != torch.float32:
        a_scale, b_scale = a_scale.float(), b_scale.float()
    if not _use_triton(a_fp8):
        return fp8_block_gemm_reference(a_fp8, a_scale, b_fp8, b_scale, bs, out_dtype, out=out, c=c)
    if out is None:
        out = torch.empty(*a_fp8.shape[:-2], m, n, dtype=out_dtype, device=a_fp8.device)
    if m == 0 or n == 0:
        return out
    if (config is None and a_fp8.dim() == 2 and m >= DEQUANT_MATMUL_MIN_M and bs[1] < 64
            and out_dtype == torch.bfloat16 and not _env.WINPORT_FP8_GEMM_CONFIG.is_set()):
        return _dequant_matmul(a_fp8, a_scale, b_fp8, b_scale, bs[0], bs[1], out, c)
    if isinstance(config, GemvConfig) or (config is None and m <= GEMV_MAX_M and a_fp8.dim() == 2
                                           and not _env.WINPORT_FP8_GEMM_CONFIG.is_set()):
        gcfg = config if isinstance(config, GemvConfig) else default_gemv_config(n, b_fp8.shape[-1], bs[0],
                                                                                 a_fp8.device, m)
        if gcfg is not None:
            if m > GEMV_MAX_M or a_fp8.dim() != 2:
                raise ValueError(f"GemvConfig applies to a 2-D [M <= {GEMV_MAX_M}, K] activation only")
            return _fp8_gemv_triton(a_fp8, a_scale, b_fp8, b_scale, bs[0], bs[1], out, c, gcfg)
    return _fp8_block_gemm_triton(a_fp8, a_scale, b_fp8, b_scale, bs[0], bs[1], out, c, config)
