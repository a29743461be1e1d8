"""Fused MoE for bf16 activations and MXFP4 experts in DeepSeek's checkpoint layout (W4A16, Triton).

Layout (what SGLang 0.5.23 loads from DeepSeek-V4(.1)'s checkpoint and what winport's GGUF loader
writes, so both feed this kernel without a repack):
- ``w13`` [E, 2I, H/2] int8/uint8: per expert the gate rows (checkpoint ``w1`` / ``gate_proj``) in
  rows [0, I), then the up rows (``w3`` / ``up_proj``) in rows [I, 2I). SGLang's FusedMoE loader
  puts shard "w1" at offset 0 and "w3" at offset I (fused_moe_triton/layer.py ``_load_w13``, no
  ``load_up_proj_weight_first`` on this path) and its activation takes gate = first half.
- ``w2`` [E, H, I/2] (down, checkpoint ``w2``).
- Two E2M1 codes per byte, the low nibble is input column 2j, the high nibble column 2j+1
  (winport/demo/quantize.py, cpu_mxfp4_moe.py). Codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15
  the same negated.
- Scales [E, N, K/32], one per 32 input columns: E8M0 bytes (uint8 or float8_e8m0fnu, value
  2^(e-127), 255 = NaN) or float32 values (the dtype SGLang's Fp8MoEMethod registers for
  ``w13_weight_scale_inv`` on CUDA).

Computation, per (token t, slot k) with expert e = topk_ids[t, k]:
  g, u = x[t] @ W13[e, :I]^T, x[t] @ W13[e, I:]^T         (fp32 accumulation, bf16 operands)
  g = min(g, limit); u = clamp(u, -limit, limit)          (DeepSeek's swiglu_limit, when given)
  a = bf16(silu(g) * u)                                   (rounded once, like SGLang's cache2)
  y[t, k] = bf16(topk_weights[t, k] * (a @ W2[e]^T))
  out[t] = bf16(routed_scaling_factor * sum_k y[t, k])    (moe_sum.py, fp32 sum)
Ids outside [0, E) (-1 = "no expert", EP-masked slots) contribute zero.

Steps: moe_align.moe_align_block_size_ref sorts the (token, slot) pairs by expert in blocks of
BLOCK_M (invalid ids land in blocks whose expert is -1); ``_mxfp4_moe_gate_up_kernel`` computes the
gate and up tiles of one block of one expert with the SwiGLU epilogue fused; ``_mxfp4_moe_down_kernel``
does the down projection and the router weight (blocks of expert -1 write zeros); moe_sum adds the
top-k slots. Weights are dequantized in registers: each byte tile [BLOCK_K/2, BLOCK_N] gives the
even-column and the odd-column halves of the K slice, and the activations are loaded as their even
and odd columns, so x @ W^T = x_even @ W_low^T + x_odd @ W_high^T needs no nibble interleave
(no tl.join / reshape of the codes). E2M1 -> fp16 is built bit by bit (no table gather; 4 integer
ops a value, the fp16 carries the value times 2^-14) and scaled by two power-of-two fp32 factors
made from the E8M0 bits: exact for every e (0 is 2^-127; above 240 the split avoids an overflow). Every dequantized weight has at
most two significant bits, so its bf16 cast is exact and the tl.dot operands are bf16 (mma.sync on
sm_80+, no Hopper-only instruction: compiles for sm_90 and sm_120).

Under TRITON_INTERPRET=1 (the CPU tests) EMULATE_BF16 makes the kernels multiply in fp32 the same
bf16-exact values (the interpreter mis-multiplies bf16 dots) and round fp32 -> bf16 by hand
(nearest-even; the interpreter truncates), and the final top-k sum goes through an fp32 buffer and
torch's rounding cast for the same reason. GPU launches use EMULATE_BF16=False.

Wired into SGLang only on request: ``WINPORT_GPU_MXFP4_MOE=1`` with ``winport serve`` on CUDA turns on
winport.patches.cuda_mxfp4_moe (tested on CPU through SGLang's own Fp8MoEMethod; not yet run on a
GPU, so not the default). How it is wired: a patch on sglang 0.5.23
``srt/layers/quantization/fp8.py:Fp8MoEMethod``: with SGLANG_DSV4_FP4_DEQUANT=0 on CUDA,
``process_weights_after_loading_block_quant`` keeps ``w13_weight`` / ``w2_weight`` int8 packed and
``w13_weight_scale_inv`` / ``w2_weight_scale_inv`` float32 [E, N, K/32] as loaded (the patched
method returns before the DeepGEMM/Marlin/flashinfer branches), and ``apply`` calls
:func:`mxfp4_moe` with ``dispatch_output.hidden_states``, ``dispatch_output.topk_output`` and the
runner config's ``swiglu_limit`` / ``routed_scaling_factor``, returning ``StandardCombineInput``. That
replaces the Triton runner (``MoeRunner(MoeRunnerBackend.TRITON)`` -> ``fused_experts_none_to_triton``
-> ``_fused_moe_kernel_sequence`` on the FP8-dequantized experts). Under kt-kernel, SGLang 0.5.23's
KT wrapper (layers/moe/kt_ep_wrapper.py, ``mask_cpu_expert_ids``) hands the GPU method topk_ids with
every CPU expert set to -1 and the GPU experts being ids 0..num_gpu_experts-1, which this kernel
takes as is (-1 and ids >= E are skipped); residency of *hot* experts (not the first N) would need
a remap of ids to resident slots before the call. GGUF stores gate and up as separate tensors
(ffn_gate_exps, ffn_up_exps): stacking them gate-first (what SGLang's loader does) is a copy, not a
repack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from kernels_triton import _env
from kernels_triton.formats import MXFP4_GROUP
from kernels_triton.formats.codecs import dequantize_mxfp4
from kernels_triton.fp8_gemm import _round_bf16  # the same nearest-even interpreter stand-in
from kernels_triton.moe_align import moe_align_block_size_ref
from kernels_triton.moe_sum import moe_sum_triton

if TYPE_CHECKING:
    from kernels_triton.mxfp4_moe_gemv import GemvMoeConfig


@dataclass(frozen=True)
class MoeConfig:
    """Tile sizes of one launch (BLOCK_K counts unpacked input columns, a multiple of 32)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# From the H200 sweep (scripts/bench/mxfp4_moe.py --sweep, scripts/bench/RESULTS.md 2026-11-30, V4.1-Flash
# sizes). Decode (a few rows per expert): the smallest tl.dot M, the weight stream dominates; the best
# swept tile was within 2-6 % of this one. Prefill (T=2048, 32 rows per expert on average, many experts
# with more): (64,64,128,4,3) took 15.3 ms where (32,64,128,4,3) took 33.2 ms and (64,64,64,8,3) or
# (128,64,64,8,3) were slower too: each dequantized weight tile serves 64 rows, and an expert with
# 33-64 rows streams its weights once instead of twice. Shared memory per stage is about 25 KB, so
# three stages fit the 99 KB of the users' SM120 cards.
CONFIGS = {
    16: MoeConfig(16, 64, 128, 4, 3),
    64: MoeConfig(64, 64, 128, 4, 3),
}


def pick_config(num_slots: int, num_experts: int) -> MoeConfig:
    """Tiles by the mean number of rows per routed expert (num_slots = tokens * top_k)."""
    rows = num_slots / max(1, min(num_experts, num_slots))
    return CONFIGS[16] if rows <= 16 else CONFIGS[64]


@triton.jit
def _e2m1_half(code_bits):
    """E2M1 codes -> fp16 holding value * 2^-14, from the bits alone (4 integer ops).

    `code_bits` has the code's sign bit at bit 3 and its 2 exponent + 1 mantissa bits at 0..2. Put
    them at fp16's sign (bit 15) and at the low exponent bits + top mantissa bit (bits 9..11): the
    fp16 number is then 2^(E-15) (1 + M/2) = value * 2^-14 for E >= 1, and for E = 0 the subnormal
    M * 2^-15 = 0.5 * 2^-14 (code 1) or zero. fp16 -> fp32 conversion is exact, subnormals included.
    """
    bits = ((code_bits & 7) << 9) | ((code_bits & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _scale_pair(s, SCALE_F32: tl.constexpr):
    """Scales as loaded -> (s_hi, s_lo) fp32 with s_hi * s_lo = 2^14 * scale, each factor finite.

    2^14 undoes _e2m1_half's 2^-14. One factor alone would overflow for scales above 2^113 (E8M0
    above 240, never seen in real weights but valid), so those are split; every factor is a power
    of two, so w = half * s_hi * s_lo is exact. E8M0 0 (2^-127) gives s_hi = 2^-113, 255 gives NaN.
    """
    if SCALE_F32:
        big = s > 2.0 ** 113
        s_hi = tl.where(big, 2.0 ** 127, s * 16384.0)
        s_lo = tl.where(big, s * 2.0 ** -113, 1.0)
    else:
        e = s.to(tl.int32)
        hi_bits = tl.where(e == 255, 0x7FC00000, (tl.minimum(e, 240) + 14) << 23)
        s_hi = hi_bits.to(tl.float32, bitcast=True)
        s_lo = ((tl.maximum(e, 240) - 113) << 23).to(tl.float32, bitcast=True)
    return s_hi, s_lo


@triton.jit
def _dequant_tile(b_ptrs, s_ptrs, mask, s_mask, GROUPS: tl.constexpr, HALF_K: tl.constexpr,
                  BLOCK_N: tl.constexpr, SCALE_F32: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """Byte tile [HALF_K, BLOCK_N] + scales [GROUPS, BLOCK_N] -> (even-column, odd-column) weights."""
    b = tl.load(b_ptrs, mask=mask, other=0).to(tl.int32)
    s_hi, s_lo = _scale_pair(tl.load(s_ptrs, mask=s_mask, other=0), SCALE_F32)
    # One scale per 16 bytes (32 columns): broadcast [GROUPS, 1, N] -> [GROUPS, 16, N] -> [HALF_K, N].
    s_hi = tl.reshape(tl.broadcast_to(s_hi[:, None, :], (GROUPS, 16, BLOCK_N)), (HALF_K, BLOCK_N))
    s_lo = tl.reshape(tl.broadcast_to(s_lo[:, None, :], (GROUPS, 16, BLOCK_N)), (HALF_K, BLOCK_N))
    w_lo = _e2m1_half(b).to(tl.float32) * s_hi * s_lo
    w_hi = _e2m1_half(b >> 4).to(tl.float32) * s_hi * s_lo
    # if/else, not an early return: Triton's compiler types every return it visits after a constexpr
    # `if` that returns, and the two branches return different dtypes.
    if EMULATE_BF16:
        return w_lo, w_hi
    else:
        # Exact: code x 2^k has at most two significant bits.
        return w_lo.to(tl.bfloat16), w_hi.to(tl.bfloat16)


@triton.jit
def _swiglu(g, u, limit, CLAMP: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """silu(min(g, limit)) * clamp(u, -limit, limit) in fp32 (rounded to bf16 once under the interpreter):
    the activation of both MoE paths, the tl.dot kernel's tile and the decode GEMV's row."""
    if CLAMP:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    a = g / (1.0 + tl.exp(-g)) * u
    if EMULATE_BF16:
        a = _round_bf16(a)
    return a


@triton.jit
def _mxfp4_moe_gate_up_kernel(
        x_ptr, w_ptr, s_ptr, act_ptr, sorted_ptr, expert_ptr, post_ptr,
        num_slots, topk, H, INTER, limit,
        s_xt, s_we, s_wn, s_se, s_sn, s_at,
        CLAMP: tl.constexpr, SCALE_F32: tl.constexpr, EMULATE_BF16: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """act[slot, n] = bf16(silu(clamp(g)) * clamp(u)) for one BLOCK_M block of one expert's slots."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    post = tl.load(post_ptr)
    if pid_m * BLOCK_M >= post:
        return
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    if e < 0:
        return  # invalid ids: the down kernel writes their zeros
    HALF_K: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // 32
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + rows).to(tl.int64)
    valid = slot < num_slots
    tok = slot // topk
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < INTER
    offs_j = tl.arange(0, HALF_K)
    offs_g = tl.arange(0, GROUPS)
    x_rows = x_ptr + tok[:, None] * s_xt
    gate_b = w_ptr + e * s_we + offs_n[None, :].to(tl.int64) * s_wn
    up_b = gate_b + INTER * s_wn
    gate_s = s_ptr + e * s_se + offs_n[None, :].to(tl.int64) * s_sn
    up_s = gate_s + INTER * s_sn
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    half_h = H // 2
    for k0 in range(0, H, BLOCK_K):
        j = k0 // 2 + offs_j
        j_mask = j < half_h
        g = k0 // 32 + offs_g
        g_mask = g < H // 32
        xm = valid[:, None] & j_mask[None, :]
        x_even = tl.load(x_rows + 2 * j[None, :], mask=xm, other=0.0)
        x_odd = tl.load(x_rows + 2 * j[None, :] + 1, mask=xm, other=0.0)
        bm = j_mask[:, None] & n_mask[None, :]
        sm = g_mask[:, None] & n_mask[None, :]
        wg_lo, wg_hi = _dequant_tile(gate_b + j[:, None], gate_s + g[:, None], bm, sm,
                                     GROUPS, HALF_K, BLOCK_N, SCALE_F32, EMULATE_BF16)
        wu_lo, wu_hi = _dequant_tile(up_b + j[:, None], up_s + g[:, None], bm, sm,
                                     GROUPS, HALF_K, BLOCK_N, SCALE_F32, EMULATE_BF16)
        if EMULATE_BF16:
            x_even = x_even.to(tl.float32)
            x_odd = x_odd.to(tl.float32)
        acc_g += tl.dot(x_even, wg_lo, out_dtype=tl.float32)
        acc_g += tl.dot(x_odd, wg_hi, out_dtype=tl.float32)
        acc_u += tl.dot(x_even, wu_lo, out_dtype=tl.float32)
        acc_u += tl.dot(x_odd, wu_hi, out_dtype=tl.float32)
    act = _swiglu(acc_g, acc_u, limit, CLAMP, EMULATE_BF16)
    tl.store(act_ptr + slot[:, None] * s_at + offs_n[None, :], act.to(act_ptr.dtype.element_ty),
             mask=valid[:, None] & n_mask[None, :])


@triton.jit
def _mxfp4_moe_down_kernel(
        act_ptr, w_ptr, s_ptr, y_ptr, tw_ptr, sorted_ptr, expert_ptr, post_ptr,
        num_slots, H, INTER,
        s_at, s_we, s_wn, s_se, s_sn, s_yt,
        SCALE_F32: tl.constexpr, EMULATE_BF16: tl.constexpr, ZERO_INVALID: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[slot, n] = bf16(topk_weight[slot] * act[slot] @ W2[e, n]^T); expert -1 blocks write zeros
    (ZERO_INVALID) or nothing (their rows keep what another launch wrote: streamed groups)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    post = tl.load(post_ptr)
    if pid_m * BLOCK_M >= post:
        return
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    HALF_K: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // 32
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + rows).to(tl.int64)
    valid = slot < num_slots
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < H
    y_ptrs = y_ptr + slot[:, None] * s_yt + offs_n[None, :]
    y_mask = valid[:, None] & n_mask[None, :]
    if e < 0:
        if ZERO_INVALID:
            tl.store(y_ptrs, tl.zeros([BLOCK_M, BLOCK_N], dtype=y_ptr.dtype.element_ty), mask=y_mask)
        return
    offs_j = tl.arange(0, HALF_K)
    offs_g = tl.arange(0, GROUPS)
    a_rows = act_ptr + slot[:, None] * s_at
    w_b = w_ptr + e * s_we + offs_n[None, :].to(tl.int64) * s_wn
    w_s = s_ptr + e * s_se + offs_n[None, :].to(tl.int64) * s_sn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    half_i = INTER // 2
    for k0 in range(0, INTER, BLOCK_K):
        j = k0 // 2 + offs_j
        j_mask = j < half_i
        g = k0 // 32 + offs_g
        g_mask = g < INTER // 32
        am = valid[:, None] & j_mask[None, :]
        a_even = tl.load(a_rows + 2 * j[None, :], mask=am, other=0.0)
        a_odd = tl.load(a_rows + 2 * j[None, :] + 1, mask=am, other=0.0)
        w_lo, w_hi = _dequant_tile(w_b + j[:, None], w_s + g[:, None], j_mask[:, None] & n_mask[None, :],
                                   g_mask[:, None] & n_mask[None, :], GROUPS, HALF_K, BLOCK_N, SCALE_F32,
                                   EMULATE_BF16)
        if EMULATE_BF16:
            a_even = a_even.to(tl.float32)
            a_odd = a_odd.to(tl.float32)
        acc += tl.dot(a_even, w_lo, out_dtype=tl.float32)
        acc += tl.dot(a_odd, w_hi, out_dtype=tl.float32)
    tw = tl.load(tw_ptr + slot, mask=valid, other=0.0).to(tl.float32)
    y = acc * tw[:, None]
    if EMULATE_BF16:
        y = _round_bf16(y)
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=y_mask)


def _interpreting() -> bool:
    return _env.interpreting()


def _require_triton_device(hidden: torch.Tensor) -> None:
    if not (hidden.is_cuda or _interpreting()):
        raise RuntimeError("mxfp4_moe: Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tests); "
                           "use mxfp4_moe_ref for a torch computation")


def _scale_view(scale: torch.Tensor, name: str) -> tuple[torch.Tensor, bool]:
    """(tensor the kernel reads, whether it holds fp32 values) for E8M0 bytes or fp32 scales."""
    if scale.dtype == torch.float32:
        return scale, True
    if scale.dtype in (torch.uint8, torch.float8_e8m0fnu):
        return scale.view(torch.uint8), False
    raise ValueError(f"mxfp4_moe: {name} must be uint8 / float8_e8m0fnu (E8M0 bytes) or float32, "
                     f"got {scale.dtype}")


def _scale_views(w13_scale: torch.Tensor, w2_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Both scale tensors as the kernels read them, and whether they are float32 (both or neither)."""
    s13, s13_f32 = _scale_view(w13_scale, "w13_scale")
    s2, s2_f32 = _scale_view(w2_scale, "w2_scale")
    if s13_f32 != s2_f32:
        raise ValueError("mxfp4_moe: w13_scale and w2_scale must both be E8M0 bytes or both float32")
    return s13, s2, s13_f32


def _check(hidden: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
           w2_scale: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> tuple[int, int, int]:
    """Validate shapes and dtypes; returns (E, H, I)."""
    if hidden.dim() != 2 or hidden.dtype != torch.bfloat16:
        raise ValueError(f"mxfp4_moe: hidden must be bf16 [T, H], got {hidden.dtype} {tuple(hidden.shape)}")
    t, h = hidden.shape
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dim() != 3 or w.dtype not in (torch.uint8, torch.int8):
            raise ValueError(f"mxfp4_moe: {name} must be packed uint8/int8 [E, N, K/2], got {w.dtype} "
                             f"{tuple(w.shape)}")
    e, two_i, half_h = w13.shape
    if 2 * half_h != h or h % MXFP4_GROUP:
        raise ValueError(f"mxfp4_moe: w13 {tuple(w13.shape)} needs last dim H/2 with H = {h} a multiple of 32")
    if two_i % 2:
        raise ValueError(f"mxfp4_moe: w13 rows {two_i} are not gate + up halves")
    i = two_i // 2
    if i % MXFP4_GROUP:
        raise ValueError(f"mxfp4_moe: intermediate size {i} (w13 rows / 2) must be a multiple of 32")
    if tuple(w2.shape) != (e, h, i // 2):
        raise ValueError(f"mxfp4_moe: w2 {tuple(w2.shape)} should be {(e, h, i // 2)} for w13 {tuple(w13.shape)}")
    if tuple(w13_scale.shape) != (e, two_i, h // MXFP4_GROUP):
        raise ValueError(f"mxfp4_moe: w13_scale {tuple(w13_scale.shape)} should be {(e, two_i, h // MXFP4_GROUP)}")
    if tuple(w2_scale.shape) != (e, h, i // MXFP4_GROUP):
        raise ValueError(f"mxfp4_moe: w2_scale {tuple(w2_scale.shape)} should be {(e, h, i // MXFP4_GROUP)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"mxfp4_moe: topk_ids must be int32/int64 [T={t}, k], got {topk_ids.dtype} "
                         f"{tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape) or not topk_weights.is_floating_point():
        raise ValueError(f"mxfp4_moe: topk_weights {topk_weights.dtype} {tuple(topk_weights.shape)} must be "
                         f"floating point shaped like topk_ids {tuple(topk_ids.shape)}")
    for name, x in (("w13", w13), ("w2", w2), ("w13_scale", w13_scale), ("w2_scale", w2_scale),
                    ("hidden", hidden)):
        if x.stride(-1) != 1:
            raise ValueError(f"mxfp4_moe: {name} must have a contiguous last dim (stride {x.stride()})")
    return e, h, i


def mxfp4_moe(hidden: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
              w2_scale: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              swiglu_limit: float | None = None, routed_scaling_factor: float = 1.0,
              config: MoeConfig | GemvMoeConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Routed-expert MoE output [T, H] bf16 for MXFP4 experts (layout in the module docstring).

    Runs the Triton kernels on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1; there is
    no silent fallback (mxfp4_moe_ref is the torch reference). ``config`` overrides the tiles: a
    MoeConfig selects the tl.dot kernels, a GemvMoeConfig the decode GEMV (mxfp4_moe_gemv.py), which
    None picks for T * top_k <= mxfp4_moe_gemv.GEMV_MAX_SLOTS.
    """
    e, h, i = _check(hidden, w13, w13_scale, w2, w2_scale, topk_ids, topk_weights)
    _require_triton_device(hidden)
    s13, s2, s13_f32 = _scale_views(w13_scale, w2_scale)
    t, topk = topk_ids.shape
    if out is None:
        out = torch.empty(t, h, dtype=torch.bfloat16, device=hidden.device)
    elif tuple(out.shape) != (t, h) or out.dtype != torch.bfloat16 or out.stride(1) != 1:
        raise ValueError(f"mxfp4_moe: out must be bf16 [{t}, {h}] with contiguous rows")
    if t == 0:
        return out
    numel = t * topk
    from kernels_triton import mxfp4_moe_gemv as gv  # here: that module imports this one

    if isinstance(config, gv.GemvMoeConfig) or (config is None and numel <= gv.GEMV_MAX_SLOTS):
        w13w, w2w = gv.words_view(w13.view(torch.uint8)), gv.words_view(w2.view(torch.uint8))
        if w13w is not None and w2w is not None:
            return gv.mxfp4_moe_gemv(hidden, w13w, s13, w2w, s2, s13_f32, topk_ids, topk_weights, swiglu_limit,
                                     routed_scaling_factor, out, config or gv.DEFAULT_GEMV_CONFIG, _interpreting())
        if config is not None:
            raise ValueError("mxfp4_moe: GemvMoeConfig needs w13/w2 viewable as int32 words (4-byte aligned strides)")
    y = torch.empty(numel, h, dtype=torch.bfloat16, device=hidden.device)
    _dot_slots(hidden, w13, s13, w2, s2, s13_f32, topk_ids, topk_weights, y, swiglu_limit,
               config or pick_config(numel, e), True)
    sum_topk(y.view(t, topk, h), out, routed_scaling_factor, _interpreting())
    return out


def mxfp4_moe_slots(hidden: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                    w2_scale: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, y: torch.Tensor,
                    swiglu_limit: float | None, config: MoeConfig, zero_invalid: bool = True) -> None:
    """The tl.dot path up to the top-k sum: y [T * top_k, H] bf16, row t * top_k + k = the weighted
    output of (token t, slot k).

    Rows whose id is outside [0, E) are set to zero, or left as they are with ``zero_invalid=False``:
    then launches over disjoint groups of experts (ids outside a group set to -1) fill one y between
    them, each row exactly as one launch over all the experts would (a row's result depends only on
    its own token and expert, and the tiles are fixed by ``config``).
    """
    e, h, i = _check(hidden, w13, w13_scale, w2, w2_scale, topk_ids, topk_weights)
    _require_triton_device(hidden)
    s13, s2, s13_f32 = _scale_views(w13_scale, w2_scale)
    numel = topk_ids.numel()
    if tuple(y.shape) != (numel, h) or y.dtype != torch.bfloat16 or not y.is_contiguous():
        raise ValueError(f"mxfp4_moe: y must be contiguous bf16 [{numel}, {h}], not {y.dtype} {tuple(y.shape)}")
    if numel:
        _dot_slots(hidden, w13, s13, w2, s2, s13_f32, topk_ids, topk_weights, y, swiglu_limit, config, zero_invalid)


def _dot_slots(hidden: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
               s13_f32: bool, topk_ids: torch.Tensor, topk_weights: torch.Tensor, y: torch.Tensor,
               swiglu_limit: float | None, cfg: MoeConfig, zero_invalid: bool) -> None:
    """mxfp4_moe_slots' launches on inputs already checked (scales as _scale_views gives them)."""
    e, h, i = w13.shape[0], hidden.shape[1], w13.shape[1] // 2
    t, topk = topk_ids.shape
    numel = t * topk
    if cfg.block_k % MXFP4_GROUP or cfg.block_m < 16 or cfg.block_n < 16:
        raise ValueError(f"mxfp4_moe: bad config {cfg} (block_k a multiple of 32, block_m/n >= 16)")
    bm = cfg.block_m
    dev = hidden.device
    # Worst case: every expert bucket (E real + 1 invalid) padded up by bm - 1, but never more
    # than one block per slot (SGLang's bound); the grid covers it, unused blocks exit at once.
    cap = min(numel + (e + 1) * (bm - 1), numel * bm)
    n_blocks = triton.cdiv(cap, bm)
    sorted_ids = torch.full((n_blocks * bm,), numel, dtype=torch.int32, device=dev)
    expert_ids = torch.full((n_blocks,), -1, dtype=torch.int32, device=dev)
    post = torch.empty(1, dtype=torch.int32, device=dev)
    moe_align_block_size_ref(topk_ids, e + 1, bm, sorted_ids, expert_ids, post, None)
    w13u = w13.view(torch.uint8)
    w2u = w2.view(torch.uint8)
    tw = topk_weights.to(torch.float32).reshape(-1).contiguous()
    act = torch.empty(numel, i, dtype=torch.bfloat16, device=dev)
    emulate = _interpreting()
    limit = float(swiglu_limit) if swiglu_limit else 0.0
    _mxfp4_moe_gate_up_kernel[(n_blocks, triton.cdiv(i, cfg.block_n))](
        hidden, w13u, s13, act, sorted_ids, expert_ids, post, numel, topk, h, i, limit,
        hidden.stride(0), w13u.stride(0), w13u.stride(1), s13.stride(0), s13.stride(1), act.stride(0),
        CLAMP=bool(swiglu_limit), SCALE_F32=s13_f32, EMULATE_BF16=emulate,
        BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    _mxfp4_moe_down_kernel[(n_blocks, triton.cdiv(h, cfg.block_n))](
        act, w2u, s2, y, tw, sorted_ids, expert_ids, post, numel, h, i,
        act.stride(0), w2u.stride(0), w2u.stride(1), s2.stride(0), s2.stride(1), y.stride(0),
        SCALE_F32=s13_f32, EMULATE_BF16=emulate, ZERO_INVALID=zero_invalid,
        BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)


def sum_topk(y: torch.Tensor, out: torch.Tensor, routed_scaling_factor: float, emulate: bool | None = None) -> None:
    """out [T, H] = routed_scaling_factor * the sum of y [T, topk, H] over its top-k axis (both MoE paths' last step).

    ``emulate`` (default: under TRITON_INTERPRET) rounds through fp32 with torch, as the interpreter needs."""
    if emulate is None:
        emulate = _interpreting()
    if emulate:
        # The interpreter truncates fp32 -> bf16 stores: sum in fp32, round with torch.
        tmp = torch.empty(y.shape[0], y.shape[2], dtype=torch.float32, device=y.device)
        moe_sum_triton(y, tmp, routed_scaling_factor)
        out.copy_(tmp)
    else:
        moe_sum_triton(y, out, routed_scaling_factor)


def dequantize_mxfp4_ref(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed [..., N, K/2] codes + scales [..., N, K/32] (E8M0 bytes or fp32 values) -> `dtype` [..., N, K].

    kernels_triton.formats.codecs.dequantize_mxfp4 (the one MXFP4 reference); the kernel's inline
    E2M1 and E8M0 decoding is checked against the formats tables by tests/ops/test_formats.py.
    """
    return dequantize_mxfp4(packed, scale, dtype)


def mxfp4_moe_ref(hidden: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                  w2_scale: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                  swiglu_limit: float | None = None, routed_scaling_factor: float = 1.0,
                  dtype: torch.dtype = torch.float64, round_like_kernel: bool = False) -> torch.Tensor:
    """Plain torch reference: dequantize each routed expert, matmul in `dtype`, result in `dtype`.

    round_like_kernel rounds to bf16 where the kernel stores bf16 (act, weighted slot output, final
    sum); without it nothing is rounded (the exact result the kernel approximates).
    """
    def rnd(v: torch.Tensor) -> torch.Tensor:
        return v.to(torch.bfloat16).to(dtype) if round_like_kernel else v

    t, h = hidden.shape
    e = w13.shape[0]
    i = w13.shape[1] // 2
    x = hidden.to(dtype)
    acc = torch.zeros(t, h, dtype=dtype, device=hidden.device)
    for ex in torch.unique(topk_ids).tolist():
        if ex < 0 or ex >= e:
            continue
        tok, slot = torch.nonzero(topk_ids == ex, as_tuple=True)
        gu = x[tok] @ dequantize_mxfp4_ref(w13[ex], w13_scale[ex], dtype).T
        g, u = gu[:, :i], gu[:, i:]
        if swiglu_limit:
            g = g.clamp(max=swiglu_limit)
            u = u.clamp(min=-swiglu_limit, max=swiglu_limit)
        act = rnd(torch.nn.functional.silu(g) * u)
        yk = rnd((act @ dequantize_mxfp4_ref(w2[ex], w2_scale[ex], dtype).T) * topk_weights[tok, slot, None].to(dtype))
        acc.index_add_(0, tok, yk)
    return rnd(acc * routed_scaling_factor)
