"""DeepSeek-V4 FP8 paged K cache ("V4" layout, 584 bytes per token): quantize, store, dequantize.

Replaces, for the V4 layout only, the K-cache helpers SGLang 0.5.23 reaches through JIT CUDA or
Triton: `sglang.kernels.ops.attention.dsv4.attn.fused_store_cache(type="flashmla")` (quantize +
store) and `sglang.kernels.ops.attention.dsv4.dequant_k_cache.dequantize_k_cache_paged_dsv4`
(gather + dequantize). The same byte layout is what FlashMLA's sparse decode reads.

Layout facts: kernels_triton.formats (the ``V4_*`` constants, from SGLang 0.5.23 `kv_layout.py` /
`dequant_k_cache.py` and FlashMLA's V4 format): per token 576 data bytes (448 e4m3 + 64 bf16) then
8 scale bytes (7 UE8M0 + 1 pad) per page row group, pages padded to a multiple of 576 bytes.
- quantization (SGLang's store): scale = 2 ** ceil(log2(max(amax_tile, 1e-8) / 448)), value =
  clamp(x / scale, -448, 448) rounded to e4m3 (round to nearest even).

Tensors accepted as "cache": the 2D pool buffer `[num_pages, page_bytes]` (uint8) or the 4D view
SGLang's backend hands FlashMLA, `[num_pages, P, 1, 584]` whose page stride is the padded page
size. Both are read through their page stride, never assuming `P * 584`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_triton._dispatch import use_triton
from kernels_triton.formats import E4M3_MAX as FP8_MAX
from kernels_triton.formats import E8M0_BIAS as UE8M0_BIAS
from kernels_triton.formats import V4_BYTES_PER_TOKEN as BYTES_PER_TOKEN
from kernels_triton.formats import V4_DATA_BYTES as DATA_BYTES
from kernels_triton.formats import V4_DIM_NOPE as DIM_NOPE
from kernels_triton.formats import V4_DIM_ROPE as DIM_ROPE
from kernels_triton.formats import V4_HEAD_DIM as HEAD_DIM
from kernels_triton.formats import V4_NUM_TILES as NUM_TILES
from kernels_triton.formats import V4_SCALE_BYTES as SCALE_BYTES
from kernels_triton.formats import V4_TILE as TILE_SIZE
from kernels_triton.formats import v4_page_bytes as page_bytes
from kernels_triton.formats.codecs import E4M3_DTYPE as FP8_DTYPE
from kernels_triton.formats.codecs import e8m0_shift_to_float, ue8m0_exponent

QUANT_EPS = 1e-8  # SGLang's V4 store clamps amax here (the fused XPU kernels use 1e-4)


def alloc_k_cache(num_pages: int, page_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A zeroed `[num_pages, page_bytes(page_size)]` uint8 pool buffer, as SGLang allocates it."""
    return torch.zeros(num_pages, page_bytes(page_size), dtype=torch.uint8, device=device)


def paged_view(buf: torch.Tensor, page_size: int) -> torch.Tensor:
    """The `[num_pages, P, 1, 584]` view of a pool buffer that SGLang passes as `k_cache`."""
    return buf[:, : page_size * BYTES_PER_TOKEN].view(buf.shape[0], page_size, 1, BYTES_PER_TOKEN)


def cache_pages(cache: torch.Tensor, page_size: int | None = None) -> tuple[torch.Tensor, int]:
    """Return `(pages, page_size)`: `pages` is a `[num_pages, page_stride]` uint8 view of `cache`.

    `cache` is the 2D pool buffer (then `page_size` is required) or the 4D FlashMLA view (its
    dim 1 is the page size). The page stride is taken from `cache.stride(0)`, which is what keeps
    the 576-byte page padding intact.
    """
    if cache.element_size() != 1:
        raise TypeError(f"a V4 K cache is a byte buffer, got dtype {cache.dtype}")
    u8 = cache.view(torch.uint8)
    if u8.dim() == 4:
        if u8.shape[2] != 1 or u8.shape[3] != BYTES_PER_TOKEN:
            raise ValueError(f"V4 K cache view must be [pages, P, 1, {BYTES_PER_TOKEN}], got {tuple(u8.shape)}")
        page_size = u8.shape[1] if page_size is None else page_size
        if page_size != u8.shape[1]:
            raise ValueError(f"page_size {page_size} != cache view's {u8.shape[1]}")
    elif u8.dim() != 2:
        raise ValueError(f"V4 K cache must be 2D or 4D, got {u8.dim()}D")
    elif page_size is None:
        raise ValueError("page_size is required with a 2D cache buffer")
    stride = u8.stride(0)
    if stride < page_size * BYTES_PER_TOKEN:
        raise ValueError(f"page stride {stride} < {page_size} x {BYTES_PER_TOKEN} bytes")
    pages = torch.as_strided(u8, (u8.shape[0], stride), (stride, 1), u8.storage_offset())
    return pages, page_size


# ----------------------------------------------------------------------------------------------
# Torch reference (also the CPU path)
# ----------------------------------------------------------------------------------------------


def quantize_k_v4_reference(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize `[N, 512]` K rows to the V4 parts: (nope e4m3 [N, 448], rope bf16 [N, 64], ue8m0 [N, 7]).

    Same math as SGLang's V4 store (see the module docstring); it is the reference the Triton
    store is tested against byte for byte.
    """
    if k.shape[-1] != HEAD_DIM:
        raise ValueError(f"K rows must have {HEAD_DIM} dims, got {k.shape[-1]}")
    x = k.reshape(-1, HEAD_DIM)
    nope = x[:, :DIM_NOPE].float().view(-1, NUM_TILES, TILE_SIZE)
    amax = nope.abs().amax(dim=-1).clamp_min(QUANT_EPS)
    exp = ue8m0_exponent(amax / FP8_MAX) - UE8M0_BIAS  # [N, 7], exact ceil(log2)
    inv = torch.ldexp(torch.ones_like(amax), -exp)  # exact 2**-exp
    scaled = (nope * inv.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    nope_fp8 = scaled.reshape(-1, DIM_NOPE).to(FP8_DTYPE)
    rope = x[:, DIM_NOPE:].to(torch.bfloat16)
    scale_u8 = (exp + UE8M0_BIAS).to(torch.uint8)
    return nope_fp8, rope, scale_u8


def _token_offsets(loc: torch.Tensor, page_size: int, page_stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte offsets (from the cache start) of each token's data row and of its scale row."""
    loc = loc.to(torch.int64)
    page, slot = loc // page_size, loc % page_size
    base = page * page_stride
    return base + slot * DATA_BYTES, base + page_size * DATA_BYTES + slot * SCALE_BYTES


def store_k_v4_reference(k: torch.Tensor, cache: torch.Tensor, loc: torch.Tensor,
                         page_size: int | None = None) -> None:
    """Quantize `k` `[N, 512]` and write token `i` to cache index `loc[i]` (in place)."""
    pages, page_size = cache_pages(cache, page_size)
    nope_fp8, rope, scale_u8 = quantize_k_v4_reference(k)
    n = nope_fp8.shape[0]
    if loc.numel() != n:
        raise ValueError(f"{loc.numel()} locations for {n} K rows")
    data_off, scale_off = _token_offsets(loc.reshape(-1), page_size, pages.shape[1])
    row = torch.cat(
        [nope_fp8.view(torch.uint8), rope.contiguous().view(torch.uint8),
         scale_u8, torch.zeros(n, 1, dtype=torch.uint8, device=k.device)], dim=1)  # [N, 584]
    flat = pages.reshape(-1)  # a view: cache_pages returns a dense [pages, stride] window
    d_idx = data_off[:, None] + torch.arange(DATA_BYTES, device=k.device)[None, :]
    s_idx = scale_off[:, None] + torch.arange(SCALE_BYTES, device=k.device)[None, :]
    flat[d_idx] = row[:, :DATA_BYTES]
    flat[s_idx] = row[:, DATA_BYTES:]


def gather_k_v4_reference(cache: torch.Tensor, token_ids: torch.Tensor, page_size: int | None = None,
                          out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize the cache rows `token_ids` (any shape, int) into `[*token_ids.shape, 512]`.

    Negative ids read row 0 (callers mask them); ids are not bounds-checked beyond that. The
    dequantized values are exact in fp32 and in bf16 (e4m3 times a power of two).
    A scale byte below 1 (2**-127, subnormal) reads as zero, as SGLang's reference does.
    """
    pages, page_size = cache_pages(cache, page_size)
    ids = token_ids.reshape(-1).to(torch.int64).clamp_min(0)
    page, slot = ids // page_size, ids % page_size
    dev = pages.device
    data = pages[page[:, None], (slot * DATA_BYTES)[:, None] + torch.arange(DATA_BYTES, device=dev)[None, :]]
    sc = pages[page[:, None], (page_size * DATA_BYTES + slot * SCALE_BYTES)[:, None]
               + torch.arange(NUM_TILES, device=dev)[None, :]]
    nope = data[:, :DIM_NOPE].contiguous().view(FP8_DTYPE).float().view(-1, NUM_TILES, TILE_SIZE)
    scale = e8m0_shift_to_float(sc)  # 2**(s-127) for s in 1..254, and 0 for s == 0
    nope = (nope * scale.unsqueeze(-1)).view(-1, DIM_NOPE)
    rope = data[:, DIM_NOPE:].contiguous().view(torch.bfloat16).float()
    out = torch.cat([nope, rope], dim=1).to(out_dtype)
    return out.view(*token_ids.shape, HEAD_DIM)


# ----------------------------------------------------------------------------------------------
# Triton kernels (CUDA)
# ----------------------------------------------------------------------------------------------


@triton.jit
def round_to_e4m3(v):
    """Round fp32 `v` (|v| <= 448) to the nearest e4m3 value, ties to even, staying in fp32.

    The fp32 -> fp8 cast is then exact. Rounding first is what makes the bytes identical on every
    backend: Triton's interpreter (the CPU test path) mis-rounds values whose mantissa carries into
    the next binade (124.5 -> 64), while GPUs round to nearest even.
    """
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # e4m3 subnormals share the 2**-6 binade's ulp
    # magic = 1.5 * 2**23 * ulp with ulp = 2**(e - 3): (v + magic) - magic rounds v to a multiple
    # of ulp with the fp32 adder's round-to-nearest-even.
    magic = ((e - 3 + 23 + 127) << 23).to(tl.float32, bitcast=True) * 1.5
    r = (v + magic) - magic
    # a negative value that rounds to zero is -0.0 (byte 0x80) in torch's cast: v * 0.0 keeps the sign
    return tl.where(r == 0.0, v * 0.0, r)


@triton.jit
def _store_k_v4_kernel(k_ptr, stride_k, cache_ptr, loc_ptr, page_stride, PAGE_SIZE: tl.constexpr,
                       DIM_NOPE: tl.constexpr, DIM_ROPE: tl.constexpr, TILE: tl.constexpr,
                       NUM_TILES: tl.constexpr, DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr,
                       FP8_MAX: tl.constexpr, EPS: tl.constexpr):
    # One program per (token, tile); tile NUM_TILES copies the bf16 RoPE part.
    tok = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    loc = tl.load(loc_ptr + tok).to(tl.int64)
    page = loc // PAGE_SIZE
    slot = loc % PAGE_SIZE
    data_base = page * page_stride + slot * DATA_BYTES
    cols = tl.arange(0, TILE)
    if tile == NUM_TILES:
        r = tl.load(k_ptr + tok * stride_k + DIM_NOPE + cols, mask=cols < DIM_ROPE).to(tl.bfloat16)
        # bf16 element index of the RoPE part; data_base + DIM_NOPE is even (576- and 448-aligned).
        rope_ptr = cache_ptr.to(tl.pointer_type(tl.bfloat16))
        tl.store(rope_ptr + (data_base + DIM_NOPE) // 2 + cols, r, mask=cols < DIM_ROPE)
    else:
        x = tl.load(k_ptr + tok * stride_k + tile * TILE + cols).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(x), axis=0), EPS)
        y = amax / FP8_MAX
        # ceil(log2(y)) from the fp32 bits (exact; lg2.approx could be off by one next to 2**k).
        bits = y.to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        inv = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2**-e, exact
        q = round_to_e4m3(tl.minimum(tl.maximum(x * inv, -FP8_MAX), FP8_MAX)).to(tl.float8e4nv)
        fp8_ptr = cache_ptr.to(tl.pointer_type(tl.float8e4nv))
        tl.store(fp8_ptr + data_base + tile * TILE + cols, q)
        scale_off = page * page_stride + PAGE_SIZE * DATA_BYTES + slot * SCALE_BYTES + tile
        tl.store(cache_ptr + scale_off, (e + 127).to(tl.uint8))
        if tile == NUM_TILES - 1:
            tl.store(cache_ptr + scale_off + 1, tl.zeros((), dtype=tl.uint8))  # the pad byte


def store_k_v4_triton(k: torch.Tensor, cache: torch.Tensor, loc: torch.Tensor,
                      page_size: int | None = None) -> None:
    """Triton twin of `store_k_v4_reference` (same bytes)."""
    pages, page_size = cache_pages(cache, page_size)
    k2 = k.reshape(-1, HEAD_DIM)
    if k2.stride(-1) != 1:
        k2 = k2.contiguous()
    loc = loc.reshape(-1).contiguous()
    if loc.numel() != k2.shape[0]:
        raise ValueError(f"{loc.numel()} locations for {k2.shape[0]} K rows")
    if loc.numel() == 0:
        return
    _store_k_v4_kernel[(k2.shape[0], NUM_TILES + 1)](
        k2, k2.stride(0), pages, loc, pages.stride(0), PAGE_SIZE=page_size, DIM_NOPE=DIM_NOPE,
        DIM_ROPE=DIM_ROPE, TILE=TILE_SIZE, NUM_TILES=NUM_TILES, DATA_BYTES=DATA_BYTES,
        SCALE_BYTES=SCALE_BYTES, FP8_MAX=FP8_MAX, EPS=QUANT_EPS, num_warps=1)


@triton.jit
def load_k_v4_rows(cache_ptr, ids, valid, page_stride, PAGE_SIZE: tl.constexpr,
                   DIM_NOPE: tl.constexpr, TILE: tl.constexpr, DATA_BYTES: tl.constexpr,
                   SCALE_BYTES: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Dequantized `[BLOCK, 512]` fp32 rows of token ids `ids` (rows where `valid` is False read 0).

    Shared by the dequant kernel and the sparse-attention kernels.
    """
    ids = tl.where(valid, ids, 0).to(tl.int64)
    page = ids // PAGE_SIZE
    slot = ids % PAGE_SIZE
    data_base = page * page_stride + slot * DATA_BYTES
    scale_base = page * page_stride + PAGE_SIZE * DATA_BYTES + slot * SCALE_BYTES
    cols = tl.arange(0, HEAD_DIM)
    is_nope = cols < DIM_NOPE
    fp8_ptr = cache_ptr.to(tl.pointer_type(tl.float8e4nv))
    bf16_ptr = cache_ptr.to(tl.pointer_type(tl.bfloat16))
    m_nope = valid[:, None] & is_nope[None, :]
    m_rope = valid[:, None] & (~is_nope)[None, :]
    nope = tl.load(fp8_ptr + data_base[:, None] + cols[None, :], mask=m_nope, other=0.0).to(tl.float32)
    s = tl.load(cache_ptr + scale_base[:, None] + (cols // TILE)[None, :], mask=m_nope, other=0)
    scale = (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # 2**(s-127); 0 for s == 0
    rope = tl.load(bf16_ptr + ((data_base + DIM_NOPE) // 2)[:, None] + (cols - DIM_NOPE)[None, :],
                   mask=m_rope, other=0.0).to(tl.float32)
    return tl.where(is_nope[None, :], nope * scale, rope)


@triton.jit
def _gather_k_v4_kernel(cache_ptr, ids_ptr, out_ptr, stride_out, n, page_stride,
                        PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr, DIM_NOPE: tl.constexpr,
                        TILE: tl.constexpr, DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr,
                        HEAD_DIM: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = rows < n
    ids = tl.load(ids_ptr + rows, mask=in_range, other=0)
    k = load_k_v4_rows(cache_ptr, ids, in_range & (ids >= 0), page_stride, PAGE_SIZE, DIM_NOPE, TILE,
                       DATA_BYTES, SCALE_BYTES, HEAD_DIM)
    cols = tl.arange(0, HEAD_DIM)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :],
             k.to(out_ptr.dtype.element_ty), mask=in_range[:, None])


def gather_k_v4_triton(cache: torch.Tensor, token_ids: torch.Tensor, page_size: int | None = None,
                       out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Triton twin of `gather_k_v4_reference` (negative ids give zero rows). Returns `[N, 512]`."""
    pages, page_size = cache_pages(cache, page_size)
    ids = token_ids.reshape(-1).contiguous()
    n = ids.numel()
    if out is None:
        out = torch.empty(n, HEAD_DIM, dtype=out_dtype, device=pages.device)
    out2 = out.view(n, HEAD_DIM) if n else out
    if n:
        block = 8
        _gather_k_v4_kernel[(triton.cdiv(n, block),)](
            pages, ids, out2, out2.stride(0), n, pages.stride(0), PAGE_SIZE=page_size, BLOCK=block,
            DIM_NOPE=DIM_NOPE, TILE=TILE_SIZE, DATA_BYTES=DATA_BYTES, SCALE_BYTES=SCALE_BYTES,
            HEAD_DIM=HEAD_DIM, num_warps=4)
    return out


# ----------------------------------------------------------------------------------------------
# Device dispatch
# ----------------------------------------------------------------------------------------------


def store_k_v4(k: torch.Tensor, cache: torch.Tensor, loc: torch.Tensor, page_size: int | None = None) -> None:
    """Quantize and store K rows into a V4 cache: Triton on CUDA, the torch reference elsewhere."""
    if use_triton(cache):
        store_k_v4_triton(k, cache, loc, page_size)
    else:
        store_k_v4_reference(k, cache, loc, page_size)


def dequantize_k_cache_paged_v4(quant_k_cache: torch.Tensor, page_table_1_flattened: torch.Tensor,
                                page_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """`dequantize_k_cache_paged_dsv4` for the V4 layout: `[N, 1, 512]` bf16 rows of the given ids."""
    n = page_table_1_flattened.numel()
    if use_triton(quant_k_cache):
        res = gather_k_v4_triton(quant_k_cache, page_table_1_flattened, page_size,
                                 out=None if out is None else out.view(n, HEAD_DIM))
    else:
        res = gather_k_v4_reference(quant_k_cache, page_table_1_flattened, page_size, torch.bfloat16)
        if out is not None:
            out.view(n, HEAD_DIM).copy_(res)
            res = out
    return res.view(n, 1, HEAD_DIM)
