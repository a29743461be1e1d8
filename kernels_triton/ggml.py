"""GGUF block dequantization and the GGUF matmuls (sgl_kernel.quantization ggml_dequantize,
ggml_mul_mat_vec_a8, ggml_mul_mat_a8, ggml_moe_a8, ggml_moe_a8_vec).

Weights arrive as uint8 [rows, bytes_per_row] in GGML block layout. Torch on every device (bit
unpacking with vectorized tensor ops): winport converts GGUF weights at load time (Q8_0 dense to
FP8, MXFP4 experts to kt-kernel's layout), so these run once per tensor or on fallback paths, and
the matmuls dequantize then call cuBLAS, which at prefill sizes beats an int8 dot-product kernel.
A fused dequant-GEMV Triton kernel would pay only for decode with GGUF-resident weights (not used).
The "_a8" names quantize activations to int8 upstream; here activations stay in their dtype, which
is at least as accurate (tests compare with a dequantize-then-matmul reference).
"""

from __future__ import annotations

import torch

from kernels_triton.formats import GGML_BLOCKS, GGMLType
from kernels_triton.formats.codecs import dequantize_mxfp4_ggml_blocks, q8_0_values

T = GGMLType
# The types this module dequantizes -> (values per block, bytes per block), from the formats table.
BLOCK: dict[GGMLType, tuple[int, int]] = {t: GGML_BLOCKS[t] for t in (
    T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K, T.MXFP4)}
_PLAIN = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}
MOE_BLOCK = 4  # MOE_X of the upstream GGUF MMQ kernels (SGLang passes it to moe_align_block_size)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 little-endian -> float32 [...]."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _lo_hi(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 nibbles: element j = low nibble of byte j, j+16 = high nibble."""
    return torch.cat([qs & 0xF, qs >> 4], dim=-1).to(torch.int32)


def _scale_min_k4(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K 12-byte packed 6-bit scales and mins -> int32 [..., 8] each."""
    s = sc.to(torch.int32)
    d = torch.empty(*s.shape[:-1], 8, dtype=torch.int32, device=s.device)
    m = torch.empty_like(d)
    d[..., :4] = s[..., 0:4] & 63
    m[..., :4] = s[..., 4:8] & 63
    d[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    m[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return d, m


def _dequant_blocks(b: torch.Tensor, qtype: int) -> torch.Tensor:
    """b: uint8 [nblocks, bytes_per_block] -> float32 [nblocks, values_per_block]."""
    if qtype == T.Q8_0:
        return q8_0_values(b[:, 0:2].contiguous().view(torch.float16).squeeze(-1), b[:, 2:34].view(torch.int8))
    if qtype == T.Q4_0:
        return _f16(b[:, 0:2])[:, None] * (_lo_hi(b[:, 2:18]) - 8).float()
    if qtype == T.Q4_1:
        return _f16(b[:, 0:2])[:, None] * _lo_hi(b[:, 4:20]).float() + _f16(b[:, 2:4])[:, None]
    if qtype in (T.Q5_0, T.Q5_1):
        off = 2 if qtype == T.Q5_0 else 4
        qh = b[:, off:off + 4].to(torch.int64)
        qh = qh[:, 0] | (qh[:, 1] << 8) | (qh[:, 2] << 16) | (qh[:, 3] << 24)
        bits = ((qh[:, None] >> torch.arange(32, device=b.device)) & 1).to(torch.int32)
        q = _lo_hi(b[:, off + 4:off + 20]) | (bits << 4)
        if qtype == T.Q5_0:
            return _f16(b[:, 0:2])[:, None] * (q - 16).float()
        return _f16(b[:, 0:2])[:, None] * q.float() + _f16(b[:, 2:4])[:, None]
    if qtype == T.MXFP4:
        return dequantize_mxfp4_ggml_blocks(b)
    if qtype == T.Q4_K:
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _scale_min_k4(b[:, 4:16])
        qs = b[:, 16:144].reshape(-1, 4, 32).to(torch.int32)
        q = torch.stack([qs & 0xF, qs >> 4], dim=2).reshape(-1, 8, 32).float()  # sub-block 2j: low, 2j+1: high
        y = d[:, None, None] * sc[..., None].float() * q - dmin[:, None, None] * mn[..., None].float()
        return y.reshape(-1, 256)
    if qtype == T.Q6_K:
        ql = b[:, 0:128].reshape(-1, 2, 64).to(torch.int32)
        qh = b[:, 128:192].reshape(-1, 2, 32).to(torch.int32)
        sc = b[:, 192:208].view(torch.int8).reshape(-1, 2, 8).float()
        d = _f16(b[:, 208:210])
        q1 = (ql[..., :32] & 0xF) | ((qh & 3) << 4)
        q2 = (ql[..., 32:] & 0xF) | (((qh >> 2) & 3) << 4)
        q3 = (ql[..., :32] >> 4) | (((qh >> 4) & 3) << 4)
        q4 = (ql[..., 32:] >> 4) | (((qh >> 6) & 3) << 4)
        q = torch.stack([q1, q2, q3, q4], dim=2).reshape(-1, 2, 8, 16).float() - 32.0  # 16-value groups
        y = d[:, None, None, None] * sc[..., None] * q
        return y.reshape(-1, 256)
    raise NotImplementedError(f"winport ggml_dequantize: GGML type {qtype} is not implemented "
                              f"(supported: {sorted(int(t) for t in BLOCK)})")


def dequantize(w: torch.Tensor, qtype: int, m: int, n: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """uint8 [m, bytes] (or any shape with m*bytes bytes) -> [m, n] of dtype (default float16)."""
    dtype = dtype or torch.float16
    if qtype in _PLAIN:
        return w.contiguous().view(torch.uint8).view(_PLAIN[qtype]).reshape(m, n).to(dtype)
    if qtype not in BLOCK:
        _dequant_blocks(w[:0], qtype)
    vals, nbytes = BLOCK[qtype]
    blocks = w.contiguous().view(torch.uint8).reshape(-1, nbytes)
    return _dequant_blocks(blocks, qtype).reshape(m, n).to(dtype)


def mul_mat(w: torch.Tensor, x: torch.Tensor, qtype: int, rows: int) -> torch.Tensor:
    """y [tokens, rows] = x @ dequant(w).T, in x's dtype (fp32 accumulate on CPU)."""
    _, nbytes = BLOCK[qtype]
    vals = BLOCK[qtype][0]
    n = w.shape[-1] // nbytes * vals
    wd = dequantize(w, qtype, rows, n, torch.float32 if x.device.type == "cpu" else x.dtype)
    return (x.to(wd.dtype) @ wd.T).to(x.dtype)


def moe_a8(x: torch.Tensor, w: torch.Tensor, sorted_token_ids: torch.Tensor, expert_ids: torch.Tensor,
           num_tokens_post_padded: torch.Tensor, qtype: int, rows: int, top_k: int, tokens: int) -> torch.Tensor:
    """Block-sorted MoE GEMM: out[s] = x[s // top_k] @ dequant(w[e]).T for every sorted slot s < tokens*top_k
    in a block of expert e (blocks of MOE_BLOCK slots, SGLang's ggml_moe_get_block_size on CUDA)."""
    out = torch.zeros(tokens * top_k, rows, dtype=x.dtype, device=x.device)
    total = int(num_tokens_post_padded.reshape(-1)[0])
    ids = sorted_token_ids[:total].long()
    blk_e = expert_ids[: (total + MOE_BLOCK - 1) // MOE_BLOCK].long()
    slot_e = blk_e.repeat_interleave(MOE_BLOCK)[:total]
    valid = (ids < tokens * top_k) & (slot_e >= 0)
    for e in torch.unique(slot_e[valid]).tolist():
        sel = ids[valid & (slot_e == e)]
        out[sel] = mul_mat(w[e], x[sel // top_k], qtype, rows)
    return out


def moe_a8_vec(x: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, top_k: int, qtype: int, rows: int,
               tokens: int) -> torch.Tensor:
    """Decode MoE GEMV: out[t*top_k + k] = x[t or t*top_k+k] @ dequant(w[topk_ids[t, k]]).T.

    x has `tokens` rows (shared across a token's slots) or tokens*top_k rows (one per slot)."""
    ids = topk_ids.reshape(-1).long()
    out = torch.zeros(ids.numel(), rows, dtype=x.dtype, device=x.device)
    per_slot = x.shape[0] == ids.numel()
    src_rows = torch.arange(ids.numel(), device=x.device)
    src_rows = src_rows if per_slot else src_rows // top_k
    for e in torch.unique(ids[ids >= 0]).tolist():
        sel = torch.nonzero(ids == e).reshape(-1)
        out[sel] = mul_mat(w[e], x[src_rows[sel]], qtype, rows)
    return out
