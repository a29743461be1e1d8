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

from kernels_triton import _dispatch
from kernels_triton.formats.codecs import E4M3_DTYPE as FP8_DTYPE
from kernels_triton.formats.codecs import e2m1_decode, e8m0_shift_to_float, unpack_nibbles, unpack_ue8m0_int32
from kernels_triton.sparse_mla import interpreting, mma

_REF_BYTES = 256 << 20


# ----------------------------------------------------------------------------------------------
# Dequantization helpers (torch)
# ----------------------------------------------------------------------------------------------


def dequant_fp4_reference(packed: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 `[..., D/2]` + packed UE8M0 int32 `[...]` (4 bytes, one per 32 values) -> fp32 `[..., D]`."""
    vals = e2m1_decode(unpack_nibbles(packed))  # [..., D], computed on the device (graph-capturable)
    d = vals.shape[-1]
    scale = e8m0_shift_to_float(unpack_ue8m0_int32(sf.to(torch.int32).unsqueeze(-1)))  # [..., 4]: 2**(e-127)
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
    fn = paged_mqa_logits_triton if _dispatch.use_triton(data) else paged_mqa_logits_reference
    return fn(q, kv_cache, weights, context_lens, block_table, max_context_len)


def mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k=0):  # noqa: ANN001, ANN201
    """Non-paged indexer logits: Triton on CUDA, the torch reference elsewhere."""
    data = q[0] if isinstance(q, (tuple, list)) else q
    fn = mqa_logits_triton if _dispatch.use_triton(data) else mqa_logits_reference
    return fn(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k)


def num_sms(device: torch.device | None = None) -> int:
    """Streaming multiprocessors of the current CUDA device, or the CPU count without CUDA."""
    if torch.cuda.is_available():
        dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return os.cpu_count() or 1


# ----------------------------------------------------------------------------------------------
# Top-k transforms: one Triton kernel (CUDA tensors), one torch reference (every other device)
# ----------------------------------------------------------------------------------------------
#
# Every top-k transform -- SGLang's dsv4.topk functions below and the torch.ops.sgl_kernel ones that
# shims/sgl_kernel/dsv4_xpu.py serves -- is `topk_transform_rows`. Row r of `out` ([rows, k]) gets
# window positions j of scores[r, s + j] (s = row_starts[r], or 0) for j < len = seq_lens[r]:
# - len <= k: 0, 1, ..., len - 1 in order, then -1 (scores are not read);
# - len > k: the k largest of the min(len, width) window scores (in any order; among ties any of the
#   tied), -1 past them when the window has fewer than k scores. Scores rank by value, NaN above +inf
#   (as torch.topk); -0.0 and +0.0 are equal. A window position past the row end reads the row's last
#   score (a window is meant to lie inside its row). With `neg_inf_pad` a pick whose score is -inf is
#   written as -1 (SGLang's dsv4.topk semantics; its sgl_kernel ops keep such picks).
# Each position p is then written as is, as p + offsets[r] (ragged), or through the page table as
# page_table[r, p // P] * P + p % P (paged), -1 staying -1; `out_raw` (paged) receives p too.
#
# The kernel runs one program per row (looping over rows when there are more rows than programs),
# a radix select that reads the whole row once:
# 1. the largest score of every group of GS window positions (GS: a power of two giving ~4k groups,
#    at most TOPK_TUNING["max_groups"]); the only pass over the full row, a float max. Its key must be
#    the group's largest key, so the max propagates NaN and -0.0 is keyed as +0.0 (a max may return
#    either zero), else the bound of step 2 fails;
# 2. pivot p = the kth largest group maximum (radix select over the maxima). At least k scores are
#    >= p (one per group counted), and the scores > p lie in the fewer than k groups whose maximum
#    exceeds p, so there are at most (k - 1) * GS of them: a bounded workspace, and in practice a few
#    more than k (with fewer than k groups, p is below every score);
# 3. over the groups whose maximum is >= p only: compact the scores > p (key and position) and the
#    positions of the first k scores == p into the program's workspace;
# 4. radix select over the compacted candidates (if more than k) for the kth largest T;
# 5. write the candidates > T and the first ones == T, else all candidates and ties of p; -1 after.
# Keys are fp32 bits mapped to order-preserving uint32 (negatives: every bit flipped; others: sign bit
# set). A radix select searches only the bits below the common prefix of its smallest and largest key,
# one histogram (tl.histogram, no mask argument) per BITS-wide digit. No host reads: the launch only
# uses shapes, so it can be captured in a CUDA graph.

# Kernel tiling, from the H200 sweep of 2026-11-30 (scripts/bench/attention.py --topk-sweep, each
# variant's picks checked against torch.topk; RESULTS.md): 8 warps with 2048-position compaction
# and 1024-key radix tiles took 26.7 us over 4,096 scores and 43.7 us over 65,536 (one row), against
# 30.7 / 47.3 us with 16 warps and twice the tiles; 10- or 11-bit digits were 3-4x slower (their
# histograms), fewer or more groups no faster.
TOPK_TUNING: dict[str, int] = {
    "max_groups": 2048,  # group maxima per row at most (step 2 selects among them)
    "groups_per_k": 4,  # aim for this many groups per pick: the pivot then sits above most scores
    # Per-iteration tiles (powers of two). The loops of a program run one after another, each
    # iteration waiting on its loads, so large tiles keep more bytes in flight.
    "chunk": 16384,  # window positions per iteration of the full-row pass (step 1)
    "compact": 2048,  # positions per iteration of step 3 (below 65536: two counts share one scan)
    "block": 1024,  # keys per iteration of the radix selects and the writes
    "bits": 8,  # radix digit width (histogram bins = 2 ** bits)
    "num_warps": 8,
    "programs_per_sm": 2,  # programs on CUDA: each loops over rows, so the workspace stays bounded
    "cpu_programs": 4,  # programs under the interpreter
}
_NEG_INF_KEY = -2139095041  # topk_order_key(-inf): the smallest key a score can have


@triton.jit
def _topk_key(x):
    """fp32 -> uint32 key in the order of the values; -0.0 gets +0.0's key and every NaN ranks above
    +inf. No score maps to key 0, which therefore stands for "no element"."""
    u = x.to(tl.uint32, bitcast=True)
    key = u ^ ((x.to(tl.int32, bitcast=True) >> 31).to(tl.uint32, bitcast=True) | 0x80000000)
    key = tl.where(key == 0x7FFFFFFF, 0x80000000, key)  # -0.0 -> +0.0
    return tl.where(x != x, 0xFFFFFFFF, key)


@triton.jit
def _max_nan(a, b):
    """Maximum that propagates NaN (a group holding a NaN must report it: NaN ranks first); the
    reduction of step 1, and called as a plain max of keys too (which also tells
    tests/ops/triton_specializations.py that it is a helper, not a kernel to launch)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _bit_length(v):
    """Bit length of a uint32 scalar (0 for 0)."""
    n = v.to(tl.int32, bitcast=True) * 0
    for i in tl.static_range(5):
        sh = 16 >> i
        big = (v >> sh) != 0
        n += tl.where(big, sh, 0)
        v = tl.where(big, v >> sh, v)
    return n + (v != 0).to(tl.int32)


@triton.jit
def _kth_key(ptr, m, kth, lo, hi, CB: tl.constexpr, BITS: tl.constexpr):
    """Radix select over the m keys at ptr (int32 bits of uint32 keys; smallest lo, largest hi),
    1 <= kth <= m.

    Returns (T, need): T is the kth largest key, and `need` (>= 1) of the keys equal to T belong to
    the top kth (the other kth - need are above T). All keys share the bits above the bit length of
    lo ^ hi, so only the bits below it are searched: one pass per BITS-wide digit, top digit first,
    each a histogram of the digit over the keys that match the prefix found so far.
    """
    NB: tl.constexpr = 1 << BITS
    bins = tl.arange(0, NB)
    nbits = _bit_length(lo ^ hi)
    prefix = ((hi.to(tl.uint64) >> nbits) << nbits).to(tl.uint32)  # 64-bit: a shift by 32 is defined
    need = kth
    for i in range(0, (nbits + BITS - 1) // BITS):
        top = nbits - i * BITS  # the bits >= top are known (prefix)
        low = tl.maximum(top - BITS, 0)
        known = ((tl.full([], 0xFFFFFFFF, tl.uint64) >> top) << top).to(tl.uint32)
        hist = tl.zeros([NB], dtype=tl.int32)
        for c0 in range(0, m, CB):
            o = c0 + tl.arange(0, CB)
            inside = o < m
            key = tl.load(ptr + o, mask=inside, other=0).to(tl.uint32, bitcast=True)
            match = inside & ((key & known) == prefix)
            # No histogram mask (Triton 3.6 may lack it): the other keys count in bin 0. They need no
            # correction: only the counts of digits >= 1 are read below (ge[b] for b >= 1, ge[0] - hist[0]).
            digit = tl.where(match, (key >> low) & ((1 << (top - low)) - 1), 0).to(tl.int32)
            hist += tl.histogram(digit, NB)
        ge = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist  # b >= 1: matching keys with digit >= b
        b = tl.sum((ge >= need).to(tl.int32), axis=0) - 1  # ge falls with b: the last bin still >= need
        need -= tl.sum(tl.where(bins == b, ge - hist, 0), axis=0)
        prefix = prefix | (b.to(tl.uint32) << low)
    return prefix, need


@triton.jit
def _group_max(srow, c0, n, start, width, ng, max_ws, lo, hi, MASKED: tl.constexpr, HAS_STARTS: tl.constexpr,
               GS: tl.constexpr, CH: tl.constexpr):
    """Keys of the maxima of the CH // GS groups of window positions c0 .. c0 + CH - 1 -> max_ws;
    returns the running smallest and largest of them. MASKED: the chunk may run past n (else it lies
    inside the window, and its loads need no mask, so they vectorize)."""
    gi = tl.arange(0, CH // GS)
    j = c0 + gi[:, None] * GS + tl.arange(0, GS)[None, :]
    if HAS_STARTS:
        col = tl.minimum(tl.maximum(start + j, 0), width - 1)
    else:
        col = j
    if MASKED:
        x = tl.load(srow + col, mask=j < n, other=float("-inf"))
    else:
        x = tl.load(srow + col)
    gkey = _topk_key(tl.reduce(x.to(tl.float32), 1, _max_nan))
    g = c0 // GS + gi
    tl.store(max_ws + g, gkey.to(tl.int32, bitcast=True), mask=g < ng)
    lo = tl.minimum(lo, tl.min(tl.where(g < ng, gkey, 0xFFFFFFFF), axis=0))
    hi = _max_nan(hi, tl.max(tl.where(g < ng, gkey, 0), axis=0))
    return lo, hi


@triton.jit
def _topk_emit(out_row, raw_row, table_row, table_cols, page_size, off, slot, pos, key, mask,
               PAGED: tl.constexpr, HAS_RAW: tl.constexpr, NEG_INF_PAD: tl.constexpr):
    """Write window positions `pos` (-1: none; `key`: their scores' keys) into output slots `slot`."""
    if NEG_INF_PAD:
        pos = tl.where(key == 0x007FFFFF, -1, pos)  # the key of -inf
    if HAS_RAW:
        tl.store(raw_row + slot, pos, mask=mask)
    if PAGED:
        col = tl.minimum(tl.maximum(pos // page_size, 0), table_cols - 1)
        page = tl.load(table_row + col, mask=mask & (pos >= 0), other=0).to(tl.int64)
        val = tl.where(pos >= 0, page * page_size + pos % page_size, -1)
    else:
        val = tl.where(pos >= 0, pos.to(tl.int64) + off, -1)
    tl.store(out_row + slot, val, mask=mask)


@triton.jit
def _topk_transform_kernel(
    scores_ptr, stride_sr, n_srows, width, lens_ptr, starts_ptr, offsets_ptr,
    table_ptr, stride_tr, n_trows, table_cols, page_size,
    out_ptr, stride_or, raw_ptr, stride_rr, ws_ptr, stride_wr, n_rows, k, ng_cap, gt_cap,
    HAS_STARTS: tl.constexpr, HAS_OFFSETS: tl.constexpr, PAGED: tl.constexpr, HAS_RAW: tl.constexpr,
    NEG_INF_PAD: tl.constexpr, GS: tl.constexpr, CH: tl.constexpr, CG: tl.constexpr, CB: tl.constexpr,
    BITS: tl.constexpr,
):
    pid = tl.program_id(0)
    # This program's workspace (int32): group maxima | active group ids | keys of the candidates > p
    # | their positions | positions of the first k scores == p.
    ws = ws_ptr + pid.to(tl.int64) * stride_wr
    max_ws = ws
    act_ws = ws + ng_cap
    gtk_ws = ws + 2 * ng_cap
    gtp_ws = gtk_ws + gt_cap
    eq_ws = gtp_ws + gt_cap
    lane = tl.arange(0, CB)
    nprog = tl.num_programs(0)
    for it in range(0, (n_rows - pid + nprog - 1) // nprog):  # rows pid, pid + nprog, ...
        r = pid.to(tl.int64) + it * nprog
        length = tl.load(lens_ptr + r).to(tl.int64)
        out_row = out_ptr + r * stride_or
        raw_row = raw_ptr + r * stride_rr
        table_row = table_ptr + tl.minimum(r, n_trows - 1) * stride_tr
        if HAS_OFFSETS:
            off = tl.load(offsets_ptr + r).to(tl.int64)
        else:
            off = 0
        if length <= k:
            for s0 in range(0, k, CB):
                slot = s0 + lane
                _topk_emit(out_row, raw_row, table_row, table_cols, page_size, off, slot,
                           tl.where(slot < length, slot, -1), slot * 0, slot < k, PAGED, HAS_RAW, NEG_INF_PAD)
        else:
            if HAS_STARTS:
                start = tl.load(starts_ptr + r).to(tl.int64)
            else:
                start = 0
            n = tl.minimum(length, width).to(tl.int32)  # window positions 0 .. n-1
            srow = scores_ptr + tl.minimum(r, n_srows - 1) * stride_sr
            ng = (n + GS - 1) // GS
            # 1. Group maxima (full chunks unmasked, then the tail).
            lo = (n * 0).to(tl.uint32) | 0xFFFFFFFF
            hi = (n * 0).to(tl.uint32)
            n_full = n - n % CH
            for c0 in range(0, n_full, CH):
                lo, hi = _group_max(srow, c0, n, start, width, ng, max_ws, lo, hi, False, HAS_STARTS, GS, CH)
            if n_full < n:
                lo, hi = _group_max(srow, n_full, n, start, width, ng, max_ws, lo, hi, True, HAS_STARTS, GS, CH)
            tl.debug_barrier()  # the maxima are read back by other threads
            # 2. Pivot p, and the groups whose maximum is >= p.
            p = (n * 0).to(tl.uint32)
            if ng >= k:
                p, unused = _kth_key(max_ws, ng, k, lo, hi, CB, BITS)
            na = n * 0
            for c0 in range(0, ng, CB):
                g = c0 + lane
                mk = tl.load(max_ws + g, mask=g < ng, other=0).to(tl.uint32, bitcast=True)
                act = (g < ng) & (mk >= p)
                tl.store(act_ws + na + tl.cumsum(act.to(tl.int32), axis=0) - 1, g, mask=act)
                na += tl.sum(act.to(tl.int32), axis=0)
            tl.debug_barrier()
            # 3. Compact the scores > p and the first k == p of those groups.
            cnt_gt = n * 0
            cnt_eq = n * 0
            gt_lo = (n * 0).to(tl.uint32) | 0xFFFFFFFF
            gt_hi = (n * 0).to(tl.uint32)
            e = tl.arange(0, CG)
            for a0 in range(0, na, CG // GS):
                ai = a0 + e // GS
                g = tl.load(act_ws + ai, mask=ai < na, other=0)
                j = g * GS + e % GS
                ok = (ai < na) & (j < n)
                if HAS_STARTS:
                    col = tl.minimum(tl.maximum(start + j, 0), width - 1)
                else:
                    col = j
                key = _topk_key(tl.load(srow + col, mask=ok, other=0.0).to(tl.float32))
                gt = ok & (key > p)
                eq = ok & (key == p)
                both = gt.to(tl.int32) + eq.to(tl.int32) * 65536  # one scan for both counts (CG < 65536)
                cs = tl.cumsum(both, axis=0)
                gdst = cnt_gt + (cs & 65535) - 1
                edst = cnt_eq + (cs >> 16) - 1
                tl.store(gtk_ws + gdst, key.to(tl.int32, bitcast=True), mask=gt & (gdst < gt_cap))
                tl.store(gtp_ws + gdst, j, mask=gt & (gdst < gt_cap))
                tl.store(eq_ws + edst, j, mask=eq & (edst < k))
                gt_lo = tl.minimum(gt_lo, tl.min(tl.where(gt, key, 0xFFFFFFFF), axis=0))
                gt_hi = tl.maximum(gt_hi, tl.max(tl.where(gt, key, 0), axis=0))
                tot = tl.sum(both, axis=0)
                cnt_gt += tot & 65535
                cnt_eq += tot >> 16
            tl.debug_barrier()
            # 4. Threshold T among more than k candidates; else every candidate, then ties of p.
            t = p
            need_t = n * 0
            if cnt_gt > k:
                t, need_t = _kth_key(gtk_ws, cnt_gt, k, gt_lo, gt_hi, CB, BITS)
            # 5. Candidates > T and the first need_t == T; ties of p; -1 in the slots left.
            done = n * 0
            seen_t = n * 0
            for c0 in range(0, cnt_gt, CB):
                o = c0 + lane
                om = o < cnt_gt
                key = tl.load(gtk_ws + o, mask=om, other=0).to(tl.uint32, bitcast=True)
                pos = tl.load(gtp_ws + o, mask=om, other=-1)
                is_t = om & (key == t)
                rank = seen_t + tl.cumsum(is_t.to(tl.int32), axis=0) - 1
                sel = om & ((key > t) | (is_t & (rank < need_t)))
                slot = done + tl.cumsum(sel.to(tl.int32), axis=0) - 1
                _topk_emit(out_row, raw_row, table_row, table_cols, page_size, off, slot, pos, key, sel,
                           PAGED, HAS_RAW, NEG_INF_PAD)
                done += tl.sum(sel.to(tl.int32), axis=0)
                seen_t += tl.sum(is_t.to(tl.int32), axis=0)
            n_eq = tl.minimum(k - done, cnt_eq)
            for c0 in range(0, n_eq, CB):
                o = c0 + lane
                pos = tl.load(eq_ws + o, mask=o < n_eq, other=-1)
                _topk_emit(out_row, raw_row, table_row, table_cols, page_size, off, done + o, pos,
                           o.to(tl.uint32) * 0 + p, o < n_eq, PAGED, HAS_RAW, NEG_INF_PAD)
            done += n_eq
            for s0 in range(done, k, CB):
                slot = s0 + lane
                _topk_emit(out_row, raw_row, table_row, table_cols, page_size, off, slot, slot * 0 - 1,
                           slot * 0, slot < k, PAGED, HAS_RAW, NEG_INF_PAD)


def _topk_group_size(width: int, k: int) -> int:
    """GS: the largest power of two leaving >= groups_per_k * k groups, raised until at most max_groups."""
    gs = 1
    while width // (2 * gs) >= TOPK_TUNING["groups_per_k"] * k:
        gs *= 2
    while -(-width // gs) > TOPK_TUNING["max_groups"]:
        gs *= 2
    return gs


_SM_COUNT: dict[int, int] = {}


def _sm_count(index: int) -> int:
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def _topk_programs(device: torch.device) -> int:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return TOPK_TUNING["programs_per_sm"] * _sm_count(index)
    return TOPK_TUNING["cpu_programs"]


def _per_row(t: torch.Tensor, rows: int, name: str) -> torch.Tensor:
    """A per-row vector as a flat, unit-stride view (a copy only when needed), checked for length."""
    v = t.reshape(-1)
    if v.numel() < rows:
        raise ValueError(f"{name} has {v.numel()} entries for {rows} rows")
    return v if v.stride(0) == 1 else v.contiguous()


def topk_transform_triton(scores: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, *,
                          page_table: torch.Tensor | None = None, page_size: int = 1,
                          out_raw: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
                          row_starts: torch.Tensor | None = None, neg_inf_pad: bool = False) -> None:
    """`topk_transform_rows` with the Triton kernel (CUDA tensors; CPU ones under TRITON_INTERPRET=1).

    One launch, no host reads of tensor values. Allocates a per-program int32 workspace of
    2 * ceil(width / GS) + 2 * min(k * GS, width) + k entries.
    """
    rows, k = out.shape
    if rows == 0 or k == 0:
        return
    if scores.dim() != 2 or scores.shape[0] == 0:
        raise ValueError(f"scores must be [rows, width] with at least one row, got {tuple(scores.shape)}")
    if page_table is not None and page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    width = scores.shape[1]
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    lens = _per_row(seq_lens, rows, "seq_lens")
    starts = _per_row(row_starts, rows, "row_starts") if row_starts is not None else None
    offs = _per_row(offsets, rows, "out_offsets") if offsets is not None else None
    table = page_table
    if table is not None and table.stride(1) != 1:
        table = table.contiguous()
    dst = out if out.stride(1) == 1 else torch.empty(rows, k, dtype=out.dtype, device=out.device)
    raw = out_raw
    if raw is not None and raw.stride(1) != 1:
        raw = torch.empty(rows, k, dtype=out_raw.dtype, device=out_raw.device)
    gs = _topk_group_size(width, k)
    if max(TOPK_TUNING["compact"], gs) >= 65536:
        raise ValueError(f"score rows of {width} are too wide for the top-k kernel's step 3 tile")
    ng_cap = max(1, -(-width // gs))
    gt_cap = max(1, min(k * gs, width))
    programs = min(rows, _topk_programs(scores.device))
    ws = torch.empty(programs, 2 * ng_cap + 2 * gt_cap + k, dtype=torch.int32, device=scores.device)
    _topk_transform_kernel[(programs,)](
        scores, scores.stride(0), scores.shape[0], width, lens,
        starts if starts is not None else lens, offs if offs is not None else lens,
        table if table is not None else lens, table.stride(0) if table is not None else 0,
        table.shape[0] if table is not None else 1, table.shape[1] if table is not None else 1, page_size,
        dst, dst.stride(0), raw if raw is not None else dst, raw.stride(0) if raw is not None else 0,
        ws, ws.stride(0), rows, k, ng_cap, gt_cap,
        HAS_STARTS=starts is not None, HAS_OFFSETS=offs is not None, PAGED=table is not None,
        HAS_RAW=raw is not None, NEG_INF_PAD=neg_inf_pad, GS=gs, CH=max(TOPK_TUNING["chunk"], gs),
        CG=max(TOPK_TUNING["compact"], gs), CB=TOPK_TUNING["block"], BITS=TOPK_TUNING["bits"],
        num_warps=TOPK_TUNING["num_warps"])
    if dst is not out:
        out.copy_(dst)
    if raw is not None and raw is not out_raw:
        out_raw.copy_(raw)


def topk_order_key(scores: torch.Tensor) -> torch.Tensor:
    """int64 key of scores in value order (the kernel's key): -0.0 ties +0.0, NaN ranks above +inf."""
    f = scores.float()
    bits = f.contiguous().view(torch.int32).to(torch.int64)
    key = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = torch.where(f == 0, 0, key)
    return torch.where(f.isnan(), 2**31, key)


def _topk_select(keys: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Columns of the min(k, width) largest valid keys per row, largest first (rows hold at least that
    many valid columns)."""
    keys = keys.masked_fill(~valid, torch.iinfo(torch.int64).min)
    return torch.topk(keys, min(k, keys.shape[1]), dim=1).indices


def topk_positions_reference(scores: torch.Tensor, seq_lens: torch.Tensor, rows: int, k: int,
                             row_starts: torch.Tensor | None = None, neg_inf_pad: bool = False) -> torch.Tensor:
    """The torch reference of the kernel's selection: int64 [rows, k] window positions (-1: none).

    Graph-safe: every row is selected over the full score width (a fixed shape) and the selection is
    kept only in rows longer than k. Picks come largest first (the kernel's come in any order).
    """
    dev = scores.device
    width = scores.shape[1]
    lens = seq_lens.reshape(rows).to(torch.int64)
    cols = torch.arange(k, device=dev)
    short = torch.where(cols[None, :] < lens[:, None], cols[None, :], -1)
    src = _dispatch.first_rows(scores, rows)
    j = torch.arange(width, device=dev)
    if row_starts is not None:
        idx = (row_starts.reshape(rows).to(torch.int64)[:, None] + j[None, :]).clamp(0, max(width - 1, 0))
        src = src.gather(1, idx)
    keys = topk_order_key(src)
    pick = _topk_select(keys, j[None, :] < lens[:, None], k)
    if neg_inf_pad:
        pick = torch.where(keys.gather(1, pick) == _NEG_INF_KEY, -1, pick)
    if pick.shape[1] < k:  # a row narrower than k
        pick = torch.nn.functional.pad(pick, (0, k - pick.shape[1]), value=-1)
    return torch.where((lens > k)[:, None], pick, short)


def _page_transform(pos: torch.Tensor, page_table: torch.Tensor, page_size: int) -> torch.Tensor:
    """pos -> page_table[r, pos // P] * P + pos % P (page index clamped into the table), -1 kept."""
    pt = page_table.to(torch.int64)
    p = pos.clamp(min=0)
    page = pt.gather(1, (p // page_size).clamp(max=pt.shape[1] - 1))
    return torch.where(pos >= 0, page * page_size + p % page_size, -1)


def topk_transform_rows(scores: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, *,
                        page_table: torch.Tensor | None = None, page_size: int = 1,
                        out_raw: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
                        row_starts: torch.Tensor | None = None, neg_inf_pad: bool = False,
                        use_triton: bool | None = None) -> None:
    """The top-k transform behind every public one (semantics in the comment above the kernel).

    Writes out [rows, k] (and out_raw); positions go through page_table (paged) or get offsets
    added (ragged), or are written as they are. use_triton: None = the kernel where
    `_dispatch.use_triton` says (CUDA tensors; CPU tensors under TRITON_INTERPRET=1 with
    WINPORT_TRITON_ON_CPU=1), the torch reference elsewhere; True / False force one.
    """
    if use_triton is None:
        use_triton = _dispatch.use_triton(scores)
    if use_triton:
        topk_transform_triton(scores, seq_lens, out, page_table=page_table, page_size=page_size,
                              out_raw=out_raw, offsets=offsets, row_starts=row_starts, neg_inf_pad=neg_inf_pad)
        return
    rows, k = out.shape
    pos = topk_positions_reference(scores, seq_lens, rows, k, row_starts, neg_inf_pad)
    if page_table is not None:
        val = _page_transform(pos, page_table, page_size)
    elif offsets is not None:
        val = torch.where(pos >= 0, pos + offsets.reshape(rows, 1).to(torch.int64), -1)
    else:
        val = pos
    out.copy_(val.to(out.dtype))
    if out_raw is not None:
        out_raw.copy_(pos.to(out_raw.dtype))


def topk_transform_paged(scores: torch.Tensor, seq_lens: torch.Tensor, page_tables: torch.Tensor,
                         out_page_indices: torch.Tensor, page_size: int,
                         out_raw_indices: torch.Tensor | None = None) -> None:
    """SGLang `dsv4.topk.topk_transform_paged`: top-k of `scores[b, :seq_lens[b]]` (k = out width),
    mapped through `page_tables` to cache indices `page * page_size + offset`; -1 padded (picks of
    -inf scores too)."""
    topk_transform_rows(scores, seq_lens, out_page_indices, page_table=page_tables, page_size=page_size,
                        out_raw=out_raw_indices, neg_inf_pad=True)


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
    if page_tables is None:
        topk_transform_rows(scores, seq_lens, out_page_indices, neg_inf_pad=True)
        return
    topk_transform_rows(scores, seq_lens, out_page_indices, page_table=page_tables, page_size=page_size,
                        out_raw=out_raw_indices, neg_inf_pad=True)


def topk_transform_ragged_v2(scores: torch.Tensor, seq_lens: torch.Tensor, *, out_offsets: torch.Tensor,
                             out_indices: torch.Tensor, row_starts: torch.Tensor | None = None) -> None:
    """SGLang `topk_transform_ragged_v2`: top-k of `scores[i, ks : ks + seq_lens[i]]` written as
    `position + out_offsets[i]` (position relative to ks), -1 padded."""
    topk_transform_rows(scores, seq_lens, out_indices, offsets=out_offsets, row_starts=row_starts,
                        neg_inf_pad=True)
