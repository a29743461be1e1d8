"""Torch versions of SGLang 0.5.23's DeepSeek-V4 index/metadata Triton kernels and its RoPE kernel.

SGLang launches these Triton kernels for every batch; on CPU they would run in Triton's interpreter
(TRITON_INTERPRET=1), which dominated the demo server's time (scripts/bench/cpu_serve.py). Each
function here takes the kernel's own arguments (so upstream's Python wrappers stay in use) and
carries over its semantics, not its code:
- `init_compressed_attn_metadata`: `kernels/ops/attention/dsv4/metadata_kernel.py:
  _init_compressed_attn_metadata_kernel` (ratio-4/128 compressed-cache slots, positions, lengths
  and ratio-128 page indices);
- `combine_topk_swa_indices`, `build_swa_token_ids`: `sparse_prefill_kernels.py:
  _combine_topk_swa_indices_kernel` and `_build_swa_token_ids_kernel`;
- `dequantize_k_cache_paged`: `dequant_k_cache.py:_dequantize_k_cache_paged_kernel` (V4's FP8 paged
  K cache to bf16 rows);
- `rotary_gptj_inplace`: `rope.py:apply_rotary_emb_triton` (GPT-J interleaved pairs rotated by
  freqs_cis, in float32, in place).
winport.patches.cpu_dsv4_index_kernels_torch and cpu_dsv4_rope_torch hook them in for CPU tensors;
the tests compare them with the upstream kernels under the interpreter.
"""

from __future__ import annotations

from typing import Any

import torch


def init_compressed_attn_metadata(
    seq_lens_ptr: torch.Tensor, positions_ptr: torch.Tensor, raw_out_loc_ptr: torch.Tensor,
    page_table_ptr: torch.Tensor, c4_out_loc_ptr: torch.Tensor, c4_positions_ptr: torch.Tensor,
    c4_seq_lens_raw_ptr: torch.Tensor, c4_seq_lens_clamp1_ptr: torch.Tensor, c128_out_loc_ptr: torch.Tensor,
    c128_positions_ptr: torch.Tensor, c128_seq_lens_raw_ptr: torch.Tensor, c128_seq_lens_clamp1_ptr: torch.Tensor,
    c128_page_indices_ptr: torch.Tensor, bs: int, num_write_tokens: int, max_pages: int,
    c128_cur_max_seq_len: int, c128_page_size: int, BLOCK_SIZE: int = 0, COMPUTE_PAGE_INDICES: bool = True,  # noqa: N803
    **_launch: Any,
) -> None:
    """Torch version of `_init_compressed_attn_metadata_kernel` (same arguments, same outputs)."""
    seq_len = seq_lens_ptr[:bs].long()
    position = positions_ptr[:bs].long()
    w = num_write_tokens
    raw = raw_out_loc_ptr[:w].long()
    for ratio, out_loc, pos_out, raw_len, clamp1 in (
        (4, c4_out_loc_ptr, c4_positions_ptr, c4_seq_lens_raw_ptr, c4_seq_lens_clamp1_ptr),
        (128, c128_out_loc_ptr, c128_positions_ptr, c128_seq_lens_raw_ptr, c128_seq_lens_clamp1_ptr),
    ):
        # A token whose sequence length is a multiple of the ratio completes a compressed entry.
        compress = (seq_len[:w] % ratio) == 0
        out_loc[:w] = torch.where(compress, torch.div(raw, ratio, rounding_mode="floor"), 0).to(out_loc.dtype)
        pos_out[:bs] = (position & ~(ratio - 1)).to(pos_out.dtype)
        n = torch.div(seq_len, ratio, rounding_mode="floor")
        raw_len[:bs] = n.to(raw_len.dtype)
        clamp1[:bs] = n.clamp(min=1).to(clamp1.dtype)
    if COMPUTE_PAGE_INDICES and c128_cur_max_seq_len > 0:
        offsets = torch.arange(c128_cur_max_seq_len, device=seq_lens_ptr.device)
        page_idx = torch.div(offsets, c128_page_size, rounding_mode="floor")
        in_table = page_idx < max_pages
        # The kernel addresses row b of the (contiguous) page table and of the output directly.
        table = page_table_ptr.view(-1, max_pages)[:bs].long()
        pages = torch.where(in_table[None, :], table[:, page_idx.clamp(max=max(max_pages - 1, 0))], 0)
        vals = pages * c128_page_size + (offsets % c128_page_size)[None, :]
        valid = offsets[None, :] < torch.div(seq_len, 128, rounding_mode="floor")[:, None]
        out = c128_page_indices_ptr.view(-1, c128_cur_max_seq_len)[:bs]
        out.copy_(torch.where(valid, vals, -1).to(out.dtype))


def combine_topk_swa_indices(
    combined_indices_ptr: torch.Tensor, combined_indices_stride: int, combined_lens_ptr: torch.Tensor,
    topk_indices_ptr: torch.Tensor, topk_indices_stride: int, query_start_loc_ptr: torch.Tensor,
    query_pos_ptr: torch.Tensor, seq_lens_ptr: torch.Tensor, gather_lens_ptr: torch.Tensor,
    compressed_base_ptr: torch.Tensor, swa_base_ptr: torch.Tensor, swa_indices_ptr: torch.Tensor | None,
    swa_indices_stride: int, swa_lengths_ptr: torch.Tensor | None, num_tokens: int, num_reqs: int, top_k: int,
    EXPLICIT_SWA: bool, COMPRESS_RATIO: int, WINDOW_SIZE: int, WIDTH: int,  # noqa: N803
    **_launch: Any,
) -> None:
    """Torch version of `_combine_topk_swa_indices_kernel` (same arguments, same outputs).

    Row t: [its top-k compressed indices (+ its request's compressed base; -1 holes kept) | its
    sliding-window indices | -1 up to WIDTH]; length = top-k part + window part. Tokens past the
    last request's queries get a -1 row and length 0.
    """
    dev = combined_indices_ptr.device
    token = torch.arange(num_tokens, device=dev)
    starts = query_start_loc_ptr[: num_reqs + 1].long() - query_start_loc_ptr[0].long()
    # Each token's request: the last r with starts[r] <= token.
    req = (torch.searchsorted(starts, token, right=True) - 1).clamp(0, max(num_reqs - 1, 0))
    owned = token < starts[num_reqs]
    zero = torch.zeros((), dtype=torch.long, device=dev)
    pos = torch.where(owned, query_pos_ptr[:num_tokens].long(), zero)
    seq_len = torch.where(owned, seq_lens_ptr.long()[req], zero)
    gather_start = seq_len - torch.where(owned, gather_lens_ptr.long()[req], zero)
    cbase = torch.where(owned, compressed_base_ptr.long()[req], zero)
    sbase = torch.where(owned, swa_base_ptr.long()[req], zero)
    topk_len = torch.where(owned, torch.clamp(torch.div(pos + 1, COMPRESS_RATIO, rounding_mode="floor"), max=top_k),
                           zero)
    if EXPLICIT_SWA:
        assert swa_lengths_ptr is not None and swa_indices_ptr is not None
        swa_len = torch.where(owned, swa_lengths_ptr[:num_tokens].long(), zero)
    else:
        swa_len = torch.where(owned, torch.clamp(pos + 1, max=WINDOW_SIZE), zero)
    offset = torch.arange(WIDTH, device=dev)[None, :]
    in_topk = offset < topk_len[:, None]
    in_swa = offset < (topk_len + swa_len)[:, None]
    rows = topk_indices_ptr.as_strided((num_tokens, topk_indices_ptr.shape[-1]), (topk_indices_stride, 1))
    if rows.shape[1] == 0:  # SWA-only layer (top_k 0): no compressed part
        topk_vals = torch.full((num_tokens, WIDTH), -1, dtype=torch.long, device=dev)
    else:
        topk_vals = torch.gather(rows.long(), 1, offset.clamp(max=rows.shape[1] - 1).expand(num_tokens, -1))
    topk_part = torch.where(topk_vals >= 0, topk_vals + cbase[:, None], -1)
    rel = offset - topk_len[:, None]
    if EXPLICIT_SWA:
        swa_rows = swa_indices_ptr.as_strided((num_tokens, WINDOW_SIZE), (swa_indices_stride, 1)).long()
        swa_vals = torch.gather(swa_rows, 1, rel.clamp(0, WINDOW_SIZE - 1))
        swa_vals = torch.where(owned[:, None] & ~in_topk & in_swa, swa_vals, -1)
        swa_part = torch.where(swa_vals >= 0, sbase[:, None] + swa_vals, -1)
    else:
        swa_part = (sbase + pos - swa_len + 1 - gather_start)[:, None] + rel
    vals = torch.where(in_topk, topk_part, torch.where(in_swa, swa_part, -1))
    out = combined_indices_ptr.as_strided((num_tokens, WIDTH), (combined_indices_stride, 1))
    out.copy_(vals.to(out.dtype))
    combined_lens_ptr[:num_tokens] = (topk_len + swa_len).to(combined_lens_ptr.dtype)


def build_swa_token_ids(
    out_ptr: torch.Tensor, swa_first_pos_ptr: torch.Tensor, swa_gather_lens_ptr: torch.Tensor,
    swa_offsets_ptr: torch.Tensor, req_pool_indices_ptr: torch.Tensor, req_to_token_ptr: torch.Tensor,
    req_to_token_stride: int, full_to_swa_ptr: torch.Tensor, **_launch: Any,
) -> None:
    """Torch version of `_build_swa_token_ids_kernel`: out[off[r] + i] = full_to_swa[req_to_token[row r, first[r] + i]]."""
    lens = swa_gather_lens_ptr.long()
    total = int(lens.sum())
    if total == 0:
        return
    req = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    i = torch.arange(total, device=lens.device) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    # The kernel reads row req_pool_indices[r] (req_to_token_stride apart) at position first[r] + i.
    table = req_to_token_ptr.as_strided((req_to_token_ptr.shape[0], req_to_token_ptr.shape[-1]),
                                        (req_to_token_stride, 1))
    full_id = table[req_pool_indices_ptr.long()[req], swa_first_pos_ptr.long()[req] + i].long()
    dest = swa_offsets_ptr.long()[req] + i
    out_ptr[dest] = full_to_swa_ptr[full_id].to(out_ptr.dtype)


def dequantize_k_cache_paged(
    output_ptr: torch.Tensor, buf_fp8_ptr: torch.Tensor, buf_bf16_ptr: torch.Tensor, buf_uint8_ptr: torch.Tensor,
    page_table_ptr: torch.Tensor, output_stride_0: int, num_tokens: int, BYTES_PER_PAGE: int, PAGE_SIZE: int,  # noqa: N803
    DIM_NOPE: int, DIM_ROPE: int, TILE_SIZE: int, NUM_SCALE_TILES: int, NOPE_ROPE_BYTES: int,  # noqa: N803
    PADDED_SCALE_PER_TOKEN: int, S_OFFSET_BYTES: int, **_launch: Any,  # noqa: N803
) -> None:
    """Torch version of `_dequantize_k_cache_paged_kernel`: V4's FP8 paged K cache -> bf16 rows.

    Token t at cache slot loc: page loc // PAGE_SIZE, row loc % PAGE_SIZE. Its NUM_SCALE_TILES x
    TILE_SIZE e4m3 values (row data at the page's start) times 2^(scale byte - 127) (one byte per
    tile, in the page's scale area), then DIM_ROPE bf16 values right after the FP8 part. An e4m3
    value times a power of two is exact in bf16, so the result does not depend on rounding.
    """
    dev = output_ptr.device
    loc = page_table_ptr[:num_tokens].long()
    page, row = torch.div(loc, PAGE_SIZE, rounding_mode="floor"), loc % PAGE_SIZE
    data = page * BYTES_PER_PAGE + row * NOPE_ROPE_BYTES
    scale_at = page * BYTES_PER_PAGE + S_OFFSET_BYTES + row * PADDED_SCALE_PER_TOKEN
    n_fp8 = NUM_SCALE_TILES * TILE_SIZE
    fp8 = buf_fp8_ptr[data[:, None] + torch.arange(n_fp8, device=dev)].float()
    scale = buf_uint8_ptr[scale_at[:, None] + torch.arange(NUM_SCALE_TILES, device=dev)].int()
    nope = fp8.view(num_tokens, NUM_SCALE_TILES, TILE_SIZE) * torch.exp2((scale - 127).float())[:, :, None]
    rope = buf_bf16_ptr[torch.div(data[:, None] + DIM_NOPE, 2, rounding_mode="floor")
                        + torch.arange(DIM_ROPE, device=dev)]
    out = output_ptr.as_strided((num_tokens, DIM_NOPE + DIM_ROPE), (output_stride_0, 1))
    out[:, :n_fp8] = nope.reshape(num_tokens, n_fp8).to(out.dtype)
    out[:, DIM_NOPE:] = rope.to(out.dtype)


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
