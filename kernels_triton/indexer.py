"""DeepSeek-V4 lightning-indexer logits (DeepGEMM MQA logits, FP8 and FP4) and the top-k transforms.

Replaces DeepGEMM's `fp8_mqa_logits`, `fp8_paged_mqa_logits`, `fp8_fp4_mqa_logits`,
`fp8_fp4_paged_mqa_logits`, `get_paged_mqa_logits_metadata`, `get_num_sms`, and SGLang 0.5.23's
JIT-CUDA top-k transforms (`sglang.kernels.ops.attention.dsv4.topk`: `topk_transform_paged`,
`plan_topk_v2`, `topk_transform_paged_v2`, `topk_transform_ragged_v2`).

Logit definition (DeepGEMM's documented reference, restated):
    logits[r, n] = sum_h weights[r, h] * relu(q[r, h, :] . k[n, :])
with q and k dequantized (k row n carries its scale; FP4 values carry one UE8M0 scale per 32).

Layouts (facts from DeepGEMM and SGLang 0.5.23):
- FP8 paged index-K cache `[pages, block, 1, D + 4]` uint8 (D = 128): a page is `block * D` e4m3
  bytes (token-major) followed by `block` fp32 scales.
- FP4 paged index-K cache `[pages, block, 1, D/2 + 4]`: a page is `block * D/2` bytes of packed
  e2m1 (element 2i in the low nibble, 2i+1 in the high) followed by `block * 4` UE8M0 exponent
  bytes (byte c of a token scales elements [32c, 32c + 32); value 2 ** (e - 127)).
- FP4 queries: `(packed int8 [..., H, D/2], scales int32 [..., H])`, the int32 packing the four
  UE8M0 bytes little-endian; an FP8 query is a plain e4m3 tensor (or `(q, None)`).
- Paged row r = b * next_n + j (q `[B, next_n, H, D]`). With 1D `context_lens [B]` row r sees keys
  k <= context_lens[b] - next_n + j; with 2D `context_lens [B, next_n]` it sees k < context_lens[b, j].
- Non-paged row r sees keys [ks[r], ke[r]); with `max_seqlen_k > 0` the output is compressed:
  column j is key ks[r] + j.
- Invalid columns are -inf. Upstream leaves them unspecified with clean_logits=False; writing -inf
  always is one valid choice and is what every consumer (top-k on the valid range) tolerates.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels_triton.sparse_mla import interpreting, mma

FP8_DTYPE = torch.float8_e4m3fn
# e2m1 code -> value (bit 3 = sign)
_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
_REF_BYTES = 256 << 20


# ----------------------------------------------------------------------------------------------
# Dequantization helpers (torch)
# ----------------------------------------------------------------------------------------------


def _e2m1_values(code: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (int, bit 3 = sign) -> fp32, computed on the codes' device: the same exact values as
    the `_E2M1` table without a host-to-device copy of it (which a CUDA graph cannot capture)."""
    e = (code >> 1) & 3
    m = (code & 1).to(torch.float32)
    mag = torch.where(e == 0, m * 0.5, (1.0 + m * 0.5) * torch.exp2((e - 1).to(torch.float32)))
    return torch.where((code >> 3) == 1, -mag, mag)


def dequant_fp4_reference(packed: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 `[..., D/2]` + packed UE8M0 int32 `[...]` (4 bytes, one per 32 values) -> fp32 `[..., D]`."""
    p = packed.view(torch.uint8).to(torch.int64)
    vals = torch.stack([_e2m1_values(p & 0xF), _e2m1_values(p >> 4)], dim=-1).flatten(-2)  # [..., D]
    d = vals.shape[-1]
    exps = sf.to(torch.int32).contiguous().view(torch.uint8).view(*sf.shape, 4).to(torch.int32)
    scale = (exps << 23).view(torch.float32)  # 2**(e-127), exact
    n_groups = d // 32
    return (vals.view(*vals.shape[:-1], n_groups, 32) * scale[..., :n_groups, None]).flatten(-2)


def _split_q(q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(q, (tuple, list)):
        data, sf = q
    else:
        data, sf = q, None
    if data.dtype == FP8_DTYPE:
        if sf is not None:
            raise NotImplementedError("an FP8 query with a separate scale is not supported (fold it into weights)")
        return data, None
    if sf is None:
        raise ValueError(f"an FP4 query needs its scale tensor (got data dtype {data.dtype})")
    return data, sf


def dequant_q_reference(q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    """FP8 or packed-FP4 indexer query -> fp32 `[..., H, D]`."""
    data, sf = _split_q(q)
    if sf is None:
        return data.float()
    return dequant_fp4_reference(data, sf)


def paged_index_k_reference(kv_cache: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """All keys of a paged index-K cache as fp32 `[pages, block, D]` (FP8 or FP4 by the row width)."""
    pages, block, _, width = kv_cache.shape
    flat = kv_cache.view(torch.uint8).reshape(pages, block * width)
    if width == 132:  # FP8: 128 e4m3 + fp32 scale
        d = 128
        vals = flat[:, : block * d].contiguous().view(FP8_DTYPE).float().view(pages, block, d)
        sc = flat[:, block * d:].contiguous().view(torch.float32).view(pages, block, 1)
        return vals * sc, False
    if width == 68:  # FP4: 64 packed bytes + 4 UE8M0 bytes
        d = 128
        pay = flat[:, : block * d // 2].reshape(pages, block, d // 2)
        sf = flat[:, block * d // 2:].contiguous().view(torch.int32).view(pages, block)
        return dequant_fp4_reference(pay, sf), True
    raise NotImplementedError(f"index-K cache row width {width} (expected 132 FP8 or 68 FP4)")


def _logits_rows(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q [R, H, D], w [R, H], k [R or 1, L, D] -> [R, L] = sum_h w * relu(q . k)."""
    s = torch.einsum("rhd,rld->rhl", q, k.expand(q.shape[0], -1, -1)) if k.shape[0] != q.shape[0] \
        else torch.einsum("rhd,rld->rhl", q, k)
    return torch.einsum("rhl,rh->rl", s.relu_(), w)


# ----------------------------------------------------------------------------------------------
# Torch references (also the CPU path)
# ----------------------------------------------------------------------------------------------


def paged_mqa_logits_reference(
    q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
) -> torch.Tensor:
    """DeepGEMM `fp8_paged_mqa_logits` / `fp8_fp4_paged_mqa_logits` in torch: `[B*next_n, max_context_len]` fp32."""
    qf = dequant_q_reference(q)  # [B, N, H, D]
    b, n, h, d = qf.shape
    keys, _ = paged_index_k_reference(kv_cache)  # [pages, block, D]
    block = keys.shape[1]
    L = max_context_len
    nb = min(block_table.shape[1], -(-L // block))
    pos = torch.arange(L, device=qf.device)
    if context_lens.dim() == 2:
        limit = context_lens.to(torch.int64).reshape(b, n)  # k < limit
    else:
        limit = (context_lens.to(torch.int64).reshape(b, 1) - n + 1
                 + torch.arange(n, device=qf.device)[None, :])  # k <= len - n + j
    limit = limit.clamp(max=nb * block)
    out = torch.full((b * n, L), float("-inf"), dtype=torch.float32, device=qf.device)
    w = weights.float().reshape(b, n, h)
    step = max(1, _REF_BYTES // max(1, nb * block * max(d, n * h) * 4))
    for b0 in range(0, b, step):  # chunks of requests, batched inside
        bs = slice(b0, min(b, b0 + step))
        pages = block_table[bs, :nb].to(torch.int64).clamp_min(0)
        k = keys[pages].reshape(pages.shape[0], nb * block, d)[:, :L]  # [b', L', D]
        s = torch.einsum("bnhd,bld->bnhl", qf[bs], k).relu_()
        lg = torch.einsum("bnhl,bnh->bnl", s, w[bs])  # [b', n, L']
        lcols = lg.shape[-1]
        valid = pos[None, None, :lcols] < limit[bs][..., None]
        out.view(b, n, L)[bs, :, :lcols] = lg.masked_fill(~valid, float("-inf"))
    return out


def mqa_logits_reference(
    q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    max_seqlen_k: int = 0,
) -> torch.Tensor:
    """DeepGEMM `fp8_mqa_logits` / `fp8_fp4_mqa_logits` in torch: `[M, N]` (or `[M, max_seqlen_k]`)."""
    qf = dequant_q_reference(q)  # [M, H, D]
    k_data, k_sf = kv
    if k_data.dtype == FP8_DTYPE:
        keys = k_data.float() * k_sf.float().reshape(-1, 1)
    else:
        keys = dequant_fp4_reference(k_data, k_sf)
    m, h, d = qf.shape
    n_keys = keys.shape[0]
    ks = cu_seqlen_ks.to(torch.int64).reshape(m)
    ke = cu_seqlen_ke.to(torch.int64).reshape(m)
    cols = max_seqlen_k if max_seqlen_k > 0 else n_keys
    out = torch.full((m, cols), float("-inf"), dtype=torch.float32, device=qf.device)
    w = weights.float()
    j = torch.arange(cols, device=qf.device)
    step = max(1, _REF_BYTES // max(1, h * n_keys * 4))
    for r0 in range(0, m, step):
        rs = slice(r0, min(m, r0 + step))
        full = torch.einsum("mhd,nd->mhn", qf[rs], keys).relu_()
        full = torch.einsum("mhn,mh->mn", full, w[rs])  # [m', N]
        key = (ks[rs, None] + j[None, :]) if max_seqlen_k > 0 else j[None, :].expand(full.shape[0], -1)
        valid = (key >= ks[rs, None]) & (key < ke[rs, None]) & (key < n_keys) & (key >= 0)
        vals = torch.gather(full, 1, key.clamp(0, max(n_keys - 1, 0)))
        out[rs] = vals.masked_fill(~valid, float("-inf"))
    return out


def paged_mqa_logits_metadata_reference(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """A `[num_sms + 1, 2]` int32 schedule: SM i starts at (row, kv block) of an even split of all blocks.

    DeepGEMM's kernels read this; ours do not (they launch one program per (row, key block)), so
    it only has to be a well-formed schedule of the same shape for callers that keep it around.
    """
    lens = context_lens.to(torch.int64)
    lens = lens.reshape(lens.shape[0], -1)[:, -1] if lens.dim() == 2 else lens.reshape(-1)
    blocks = (lens.clamp_min(0) + block_kv - 1) // block_kv
    ends = torch.cumsum(blocks, 0)
    total = ends[-1] if ends.numel() else torch.zeros((), dtype=torch.int64, device=lens.device)
    starts = torch.arange(num_sms + 1, device=lens.device, dtype=torch.int64) * total // max(num_sms, 1)
    row = torch.searchsorted(ends, starts, right=True)
    prev = torch.where(row > 0, ends[(row - 1).clamp_min(0)] if ends.numel() else row, torch.zeros_like(row))
    return torch.stack([row, starts - prev], dim=1).to(torch.int32)


# ----------------------------------------------------------------------------------------------
# Triton kernel: one program per (query row, block of key columns)
# ----------------------------------------------------------------------------------------------


@triton.jit
def _e2m1(code):
    """e2m1 nibble (int32; bit 3 sign, bits 2..1 exponent, bit 0 mantissa) -> fp32, built from bits:
    0 / 0.5 for exponent 0, else 2^(e-1) * (1 + m/2) = fp32 exponent e + 126 with mantissa bit m."""
    e = (code >> 1) & 3
    m = code & 1
    bits = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))
    bits = bits | ((code >> 3) << 31)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _load_halves_fp8(ptr, rows_off, mask, HALF: tl.constexpr):
    """Even / odd elements of fp8 rows starting at (even) byte offsets `rows_off` -> two fp32 [R, HALF].

    One contiguous 2-byte load per element pair, split into its low (even) and high (odd) byte:
    two strided 1-byte loads per pair issued a load instruction per byte (the H200 ran the decode
    logits at ~3% of copy bandwidth that way).
    """
    i = tl.arange(0, HALF)
    p16 = ptr.to(tl.pointer_type(tl.uint16))
    pair = tl.load(p16 + (rows_off // 2)[:, None] + i[None, :], mask=mask[:, None], other=0)
    ev = (pair & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    od = (pair >> 8).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return ev, od


@triton.jit
def _load_halves_fp4(ptr, rows_off, sf_ptr, sf_off, mask, HALF: tl.constexpr):
    """Even / odd elements of packed-e2m1 rows (four UE8M0 bytes at the 4-aligned byte `sf_off` of
    `sf_ptr`) -> fp32.

    A row's four scale bytes are one int32 load, shifted per element: a byte load per element (the
    same four bytes gathered 64 times) made the FP4 logits the slowest indexer path on the H200.
    """
    i = tl.arange(0, HALF)
    p8 = ptr.to(tl.pointer_type(tl.uint8))
    s32 = sf_ptr.to(tl.pointer_type(tl.int32))
    pay = tl.load(p8 + rows_off[:, None] + i[None, :], mask=mask[:, None], other=0).to(tl.int32)
    packed = tl.load(s32 + sf_off // 4, mask=mask, other=0x7F7F7F7F)
    # element pair i (elements 2i, 2i+1) lies in 32-element group i // 16: byte i // 16 of the word
    e = (packed[:, None] >> (8 * (i // 16))[None, :]) & 0xFF
    scale = (e << 23).to(tl.float32, bitcast=True)
    return _e2m1(pay & 0xF) * scale, _e2m1((pay >> 4) & 0xF) * scale


@triton.jit
def _mqa_logits_kernel(
    q_ptr, q_sf_ptr, stride_qr, stride_qh, stride_sfr,
    k_ptr, k_sf_ptr, w_ptr, stride_wr, out_ptr, stride_or,
    lens_ptr, ke_ptr, table_ptr, stride_table, n_keys, ncols, H,
    NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, PAGED: tl.constexpr, COMPRESSED: tl.constexpr,
    BLOCK_KV: tl.constexpr, Q_FP4: tl.constexpr, K_FP4: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, HALF: tl.constexpr, DOT_F32: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    # Valid key range [lo, hi) of this row, and the key index of each output column.
    if PAGED:
        b = r // NEXT_N
        if LENS_2D:
            hi = tl.load(lens_ptr + r).to(tl.int64)
        else:
            hi = tl.load(lens_ptr + b).to(tl.int64) - NEXT_N + 1 + r % NEXT_N
        hi = tl.minimum(hi, n_keys)  # n_keys = the block table's capacity: never read past a row
        lo = hi * 0
        key = cols.to(tl.int64)
    else:
        b = r
        lo = tl.load(lens_ptr + r).to(tl.int64)
        hi = tl.load(ke_ptr + r).to(tl.int64)
        if COMPRESSED:
            key = lo + cols
        else:
            key = cols.to(tl.int64)
        hi = tl.minimum(hi, n_keys)
    valid = (cols < ncols) & (key >= lo) & (key < hi) & (key >= 0)
    out_ptrs = out_ptr + r * stride_or + cols
    if tl.max(valid.to(tl.int32), axis=0) == 0:
        tl.store(out_ptrs, tl.full([BLOCK_N], float("-inf"), tl.float32), mask=cols < ncols)
    else:
        heads = tl.arange(0, BLOCK_H)
        hmask = heads < H
        q_off = r * stride_qr + heads * stride_qh
        if Q_FP4:
            q_ev, q_od = _load_halves_fp4(q_ptr, q_off, q_sf_ptr, (r * stride_sfr + heads) * 4, hmask, HALF)
        else:
            q_ev, q_od = _load_halves_fp8(q_ptr, q_off, hmask, HALF)
        safe_key = tl.where(valid, key, 0)
        if PAGED:
            page = tl.load(table_ptr + b * stride_table + safe_key // BLOCK_KV, mask=valid, other=0).to(tl.int64)
            slot = safe_key % BLOCK_KV
            if K_FP4:
                page_bytes = BLOCK_KV * (HALF + 4)
                k_ev, k_od = _load_halves_fp4(k_ptr, page * page_bytes + slot * HALF, k_ptr,
                                              page * page_bytes + BLOCK_KV * HALF + slot * 4, valid, HALF)
                k_scale = tl.full([BLOCK_N], 1.0, tl.float32)
            else:
                page_bytes = BLOCK_KV * (2 * HALF + 4)
                k_ev, k_od = _load_halves_fp8(k_ptr, page * page_bytes + slot * (2 * HALF), valid, HALF)
                sc_ptr = k_ptr.to(tl.pointer_type(tl.float32))
                k_scale = tl.load(sc_ptr + (page * page_bytes + BLOCK_KV * 2 * HALF) // 4 + slot, mask=valid,
                                  other=0.0)
        else:
            if K_FP4:
                k_ev, k_od = _load_halves_fp4(k_ptr, safe_key * HALF, k_sf_ptr, safe_key * 4, valid, HALF)
                k_scale = tl.full([BLOCK_N], 1.0, tl.float32)
            else:
                k_ev, k_od = _load_halves_fp8(k_ptr, safe_key * (2 * HALF), valid, HALF)
                k_scale = tl.load(k_sf_ptr + safe_key, mask=valid, other=0.0)
        # bf16 holds e4m3 and scaled e2m1 values exactly, so the tensor-core inputs lose nothing.
        s = mma(q_ev.to(tl.bfloat16), tl.trans(k_ev.to(tl.bfloat16)), DOT_F32)
        s += mma(q_od.to(tl.bfloat16), tl.trans(k_od.to(tl.bfloat16)), DOT_F32)  # [BLOCK_H, BLOCK_N]
        w = tl.load(w_ptr + r * stride_wr + heads, mask=hmask, other=0.0)
        logit = tl.sum(tl.maximum(s, 0.0) * w[:, None], axis=0) * k_scale
        tl.store(out_ptrs, tl.where(valid, logit, float("-inf")), mask=cols < ncols)


def _q_parts(q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None], rows: int
             ) -> tuple[torch.Tensor, torch.Tensor | None, int, int]:
    data, sf = _split_q(q)
    h = data.shape[-2]
    d3 = data.reshape(rows, h, data.shape[-1])
    if d3.stride(-1) != 1:
        d3 = d3.contiguous()
    if sf is not None:
        sf = sf.reshape(rows, h).to(torch.int32).contiguous()
    return d3, sf, h, d3.shape[-1] * (2 if sf is not None else 1)


def _run(q3: torch.Tensor, q_sf: torch.Tensor | None, h: int, d: int, k: torch.Tensor, k_sf: torch.Tensor | None,
         k_fp4: bool, weights: torch.Tensor, out: torch.Tensor, lens: torch.Tensor, ke: torch.Tensor | None,
         table: torch.Tensor | None, n_keys: int, *, next_n: int = 1, lens_2d: bool = False, paged: bool,
         compressed: bool = False, block_kv: int = 64, block_n: int = 64) -> torch.Tensor:
    rows, ncols = out.shape
    if rows == 0 or ncols == 0:
        return out
    if d != 128:
        raise NotImplementedError(f"indexer head dim {d} (DeepSeek-V4 uses 128)")
    w = weights.reshape(rows, h).float().contiguous()
    if q_sf is None and (q3.data_ptr() % 2 or q3.stride(0) % 2 or q3.stride(1) % 2):
        q3 = q3.contiguous().clone()  # FP8 q rows are read as 2-byte pairs: even addresses only
    if k_fp4 and k.data_ptr() % 4:
        raise ValueError("the FP4 index-K cache must start at a 4-byte aligned address (its scales "
                         "are read as int32 words)")
    block_h = max(16, triton.next_power_of_2(h))
    grid = (rows, triton.cdiv(ncols, block_n))
    _mqa_logits_kernel[grid](
        q3, q_sf if q_sf is not None else q3, q3.stride(0), q3.stride(1), q_sf.stride(0) if q_sf is not None else 0,
        k, k_sf if k_sf is not None else k, w, w.stride(0), out, out.stride(0),
        lens, ke if ke is not None else lens, table if table is not None else lens,
        table.stride(0) if table is not None else 0, n_keys, ncols, h,
        NEXT_N=next_n, LENS_2D=lens_2d, PAGED=paged, COMPRESSED=compressed, BLOCK_KV=block_kv,
        Q_FP4=q_sf is not None, K_FP4=k_fp4, BLOCK_H=block_h, BLOCK_N=block_n, HALF=d // 2,
        DOT_F32=interpreting(), num_warps=4)
    return out


def paged_mqa_logits_triton(
    q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
) -> torch.Tensor:
    """Triton twin of `paged_mqa_logits_reference`."""
    data = q[0] if isinstance(q, (tuple, list)) else q
    b, n = data.shape[0], data.shape[1]
    q3, q_sf, h, d = _q_parts(q, b * n)
    pages, block, _, width = kv_cache.shape
    if width not in (132, 68):
        raise NotImplementedError(f"index-K cache row width {width} (expected 132 FP8 or 68 FP4)")
    if kv_cache.view(torch.uint8).reshape(pages, -1).stride(0) != block * width:
        raise ValueError("the paged index-K cache must be contiguous")
    lens_2d = context_lens.dim() == 2
    lens = context_lens.reshape(-1).to(torch.int32).contiguous()
    table = block_table if block_table.dtype == torch.int32 and block_table.stride(-1) == 1 \
        else block_table.to(torch.int32).contiguous()
    out = torch.empty(b * n, max_context_len, dtype=torch.float32, device=data.device)
    return _run(q3, q_sf, h, d, kv_cache.view(torch.uint8), None, width == 68, weights, out, lens, None, table,
                table.shape[1] * block, next_n=n, lens_2d=lens_2d, paged=True, block_kv=block)


def mqa_logits_triton(
    q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    max_seqlen_k: int = 0,
) -> torch.Tensor:
    """Triton twin of `mqa_logits_reference`."""
    data = q[0] if isinstance(q, (tuple, list)) else q
    m = data.shape[0]
    q3, q_sf, h, d = _q_parts(q, m)
    k_data, k_sf = kv
    k_fp4 = k_data.dtype != FP8_DTYPE
    k_data = k_data.contiguous()
    k_sf = (k_sf.to(torch.int32) if k_fp4 else k_sf.float()).reshape(-1).contiguous()
    n_keys = k_data.shape[0]
    cols = max_seqlen_k if max_seqlen_k > 0 else n_keys
    out = torch.empty(m, cols, dtype=torch.float32, device=data.device)
    return _run(q3, q_sf, h, d, k_data, k_sf, k_fp4, weights, out,
                cu_seqlen_ks.reshape(-1).to(torch.int32).contiguous(),
                cu_seqlen_ke.reshape(-1).to(torch.int32).contiguous(), None, n_keys, paged=False,
                compressed=max_seqlen_k > 0)


def paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len):  # noqa: ANN001, ANN201
    """Paged indexer logits: Triton on CUDA, the torch reference elsewhere."""
    data = q[0] if isinstance(q, (tuple, list)) else q
    fn = paged_mqa_logits_triton if data.is_cuda else paged_mqa_logits_reference
    return fn(q, kv_cache, weights, context_lens, block_table, max_context_len)


def mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k=0):  # noqa: ANN001, ANN201
    """Non-paged indexer logits: Triton on CUDA, the torch reference elsewhere."""
    data = q[0] if isinstance(q, (tuple, list)) else q
    fn = mqa_logits_triton if data.is_cuda else mqa_logits_reference
    return fn(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k)


def num_sms(device: torch.device | None = None) -> int:
    """Streaming multiprocessors of the current CUDA device, or the CPU count without CUDA."""
    if torch.cuda.is_available():
        dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return os.cpu_count() or 1


# ----------------------------------------------------------------------------------------------
# Top-k transforms (batched torch on every device: torch.topk is a native CUDA kernel too)
# ----------------------------------------------------------------------------------------------


def _topk_positions(scores: torch.Tensor, seq_lens: torch.Tensor, k: int,
                    row_starts: torch.Tensor | None = None) -> torch.Tensor:
    """Per row: positions (relative to row_starts) of the top-k scores among the first seq_lens,
    or 0..len-1 when len <= k; -1 padded. int64 [rows, k]."""
    rows, width = scores.shape
    lens = seq_lens.reshape(rows).to(torch.int64).clamp_min(0)
    starts = torch.zeros_like(lens) if row_starts is None else row_starts.reshape(rows).to(torch.int64)
    dev = scores.device
    span = width
    cols = torch.arange(span, device=dev)
    src = (starts[:, None] + cols[None, :]).clamp(0, max(width - 1, 0))
    vals = torch.gather(scores.float(), 1, src) if width else scores.new_zeros(rows, 0).float()
    vals = vals.masked_fill(cols[None, :] >= lens[:, None], float("-inf"))
    kk = min(k, span)
    top = torch.topk(vals, kk, dim=1, largest=True, sorted=False).indices if kk else vals.new_zeros(
        rows, 0, dtype=torch.int64)
    picked_ok = torch.gather(vals, 1, top) != float("-inf") if kk else top.bool()
    top = torch.where(picked_ok, top, -1)
    if kk < k:
        top = torch.nn.functional.pad(top, (0, k - kk), value=-1)
    seq = torch.arange(k, device=dev)[None, :]
    short = lens[:, None] <= k
    # Short rows take every position in order (upstream's "trivial path"), regardless of scores.
    return torch.where(short, torch.where(seq < lens[:, None], seq, -1), top)


def _page_transform(raw: torch.Tensor, page_tables: torch.Tensor, page_size: int) -> torch.Tensor:
    page = torch.gather(page_tables.to(torch.int64), 1, (raw.clamp_min(0) // page_size))
    return torch.where(raw >= 0, page * page_size + raw.clamp_min(0) % page_size, -1)


def topk_transform_paged(scores: torch.Tensor, seq_lens: torch.Tensor, page_tables: torch.Tensor,
                         out_page_indices: torch.Tensor, page_size: int,
                         out_raw_indices: torch.Tensor | None = None) -> None:
    """SGLang `dsv4.topk.topk_transform_paged`: top-k of `scores[b, :seq_lens[b]]` (k = out width),
    mapped through `page_tables` to cache indices `page * page_size + offset`; -1 padded."""
    k = out_page_indices.shape[1]
    raw = _topk_positions(scores, seq_lens, k)
    out_page_indices.copy_(_page_transform(raw, page_tables, page_size).to(out_page_indices.dtype))
    if out_raw_indices is not None:
        out_raw_indices.copy_(raw.to(out_raw_indices.dtype))


def plan_topk_v2(seq_lens: torch.Tensor, static_threshold: int = -1, *,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """SGLang `plan_topk_v2`: a `[bs + 1, 2]` int32 routing plan. Our top-k has one path, so the
    plan routes nothing to a cluster pool: row 0 = (threshold, 0 items), the rest (batch, len)."""
    bs = seq_lens.shape[0]
    plan = seq_lens.new_empty(bs + 1, 2, dtype=torch.int32) if out is None else out
    plan[0, 0] = static_threshold
    plan[0, 1] = 0
    plan[1:, 0] = torch.arange(bs, device=seq_lens.device, dtype=torch.int32)
    plan[1:, 1] = seq_lens.reshape(bs).to(torch.int32)
    return plan


def topk_transform_paged_v2(scores: torch.Tensor, seq_lens: torch.Tensor, page_tables: torch.Tensor | None,
                            out_page_indices: torch.Tensor, page_size: int, metadata: torch.Tensor,
                            out_raw_indices: torch.Tensor | None = None) -> None:
    """SGLang `topk_transform_paged_v2`: as v1; without page_tables, out_page_indices gets raw indices."""
    del metadata  # the routing plan only matters to upstream's two-path kernel
    k = out_page_indices.shape[1]
    raw = _topk_positions(scores, seq_lens, k)
    if page_tables is None:
        out_page_indices.copy_(raw.to(out_page_indices.dtype))
        return
    out_page_indices.copy_(_page_transform(raw, page_tables, page_size).to(out_page_indices.dtype))
    if out_raw_indices is not None:
        out_raw_indices.copy_(raw.to(out_raw_indices.dtype))


def topk_transform_ragged_v2(scores: torch.Tensor, seq_lens: torch.Tensor, *, out_offsets: torch.Tensor,
                             out_indices: torch.Tensor, row_starts: torch.Tensor | None = None) -> None:
    """SGLang `topk_transform_ragged_v2`: top-k of `scores[i, ks : ks + seq_lens[i]]` written as
    `position + out_offsets[i]` (position relative to ks), -1 padded."""
    k = out_indices.shape[1]
    raw = _topk_positions(scores, seq_lens, k, row_starts)
    off = out_offsets.reshape(-1, 1).to(torch.int64)
    out_indices.copy_(torch.where(raw >= 0, raw + off, -1).to(out_indices.dtype))
