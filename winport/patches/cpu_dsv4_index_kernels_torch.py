"""DeepSeek-V4's index/metadata Triton kernels on CPU in torch instead of Triton's interpreter.

Targets three kernels of sglang 0.5.23 that the DSV4 attention backend launches for every batch:
- `kernels/ops/attention/dsv4/metadata_kernel.py:_init_compressed_attn_metadata_kernel`
  (per request: ratio-4 and ratio-128 compressed-cache slots, positions and lengths, and the
  ratio-128 page indices), launched by `_init_compressed_attn_metadata_triton` at every step;
- `kernels/ops/attention/dsv4/sparse_prefill_kernels.py:_combine_topk_swa_indices_kernel`
  (per prefill token: its top-k compressed indices and sliding-window indices as one -1 padded
  row for sparse attention), launched by `combine_topk_swa_indices`;
- `sparse_prefill_kernels.py:_build_swa_token_ids_kernel` (the SWA-cache ids of each request's
  window), launched by `build_swa_token_ids`;
- `dequant_k_cache.py:_dequantize_k_cache_paged_kernel` (V4's FP8 paged K cache to bf16 rows for
  sparse prefill), launched by `dequantize_k_cache_paged_dsv4`.
On CPU they run in Triton's interpreter (TRITON_INTERPRET=1): the combine kernel alone was ~40%
of a 78-token prefill (scripts/bench/cpu_serve.py with py-spy). Each is index arithmetic (and one exact FP8 dequantization).

Only the launch is replaced: the module attribute holding each kernel becomes a launcher that,
for CPU tensors, calls a torch function taking the kernel's own arguments, so upstream's Python
wrappers (argument checks, output allocation, grid) stay in use. Other devices launch the
original kernel. The torch functions carry over the kernels' semantics (not their code); the tests
compare them with the kernels under the interpreter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from winport import envs
from winport.patches._base import UpstreamChangedError, require_source

# WINPORT_CPU_TORCH_KERNELS=0 leaves the Triton kernels (interpreted on CPU) in place.
SWITCH = envs.WINPORT_CPU_TORCH_KERNELS.name

METADATA = "sglang.kernels.ops.attention.dsv4.metadata_kernel"
SPARSE_PREFILL = "sglang.kernels.ops.attention.dsv4.sparse_prefill_kernels"
DEQUANT = "sglang.kernels.ops.attention.dsv4.dequant_k_cache"


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


class CpuLauncher:
    """Stands where a Triton kernel was: `kernel[grid](...)` runs `torch_impl(...)` for CPU tensors."""

    def __init__(self, kernel: Any, torch_impl: Callable[..., None]) -> None:
        """Wrap `kernel`; CPU launches go to `torch_impl`, called with the launch's arguments."""
        self.kernel = kernel
        self.torch_impl = torch_impl

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        """The launch for `grid` (ignored on CPU: the torch function covers the whole problem)."""
        def launch(*args: Any, **kwargs: Any) -> None:
            first = next(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
            if first.device.type == "cpu":
                return self.torch_impl(*args, **kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch


# module -> {kernel attribute: torch function}
KERNELS: dict[str, dict[str, Callable[..., None]]] = {
    METADATA: {"_init_compressed_attn_metadata_kernel": init_compressed_attn_metadata},
    SPARSE_PREFILL: {"_combine_topk_swa_indices_kernel": combine_topk_swa_indices,
                     "_build_swa_token_ids_kernel": build_swa_token_ids},
    DEQUANT: {"_dequantize_k_cache_paged_kernel": dequantize_k_cache_paged},
}


def apply() -> None:
    """Put the launchers in place (idempotent)."""
    for module_name, kernels in KERNELS.items():
        module = importlib.import_module(module_name)
        for attr, impl in kernels.items():
            current = getattr(module, attr, None)
            if current is None:
                raise UpstreamChangedError(f"{module_name}.{attr} no longer exists upstream")
            if not isinstance(current, CpuLauncher):
                setattr(module, attr, CpuLauncher(current, impl))


def register_patch() -> None:
    """Check that the kernels still compute what the torch functions do, then apply."""
    # The kernels are triton JITFunctions (no inspectable function): their modules' source is checked.
    require_source(
        METADATA,
        "c4_should_compress = (seq_len % 4) == 0",
        "c4_positions = position & (~3)",
        "c128_out_loc = tl.where(c128_should_compress, raw_out_loc // 128, 0)",
        "c128_seq_lens_clamp1 = tl.maximum(c128_seq_lens_raw, 1)",
        "c_page_indices_vals = page_table_vals * c128_page_size + offset_in_page",
        "c_page_indices_vals = tl.where(valid_mask, c_page_indices_vals, -1)",
        "_init_compressed_attn_metadata_kernel[grid](",
    )
    require_source(
        SPARSE_PREFILL,
        "topk_len = tl.where(owned, tl.minimum((pos + 1) // COMPRESS_RATIO, top_k), 0)",
        "swa_len = tl.where(owned, tl.minimum(pos + 1, WINDOW_SIZE), 0)",
        "swa_vals = tl.where(swa_vals >= 0, swa_base[:, None] + swa_vals, -1)",
        "swa_start = swa_base + pos - swa_len + 1 - gather_start",
        "tl.where(topk_vals >= 0, topk_vals + compressed_base[:, None], -1)",
        "swa_id = tl.load(full_to_swa_ptr + full_id).to(tl.int32)",
        "_combine_topk_swa_indices_kernel[(triton.cdiv(num_tokens, block_t),)](",
        "_build_swa_token_ids_kernel[(num_reqs, NUM_WORKERS)](",
    )
    require_source(
        DEQUANT,
        "page_idx = loc // PAGE_SIZE",
        "token_data_base = page_byte_base + in_page * NOPE_ROPE_BYTES",
        "page_byte_base + S_OFFSET_BYTES + in_page * PADDED_SCALE_PER_TOKEN",
        "scale_pow2 = tl.exp2((scale_u8 - 127).to(tl.float32))",
        "bf16_off = (token_data_base[:, None] + DIM_NOPE) // 2 + rope_offs[None, :]",
        "_dequantize_k_cache_paged_kernel[(triton.cdiv(num_tokens, tokens_per_prog),)](",
    )
    if not envs.WINPORT_CPU_TORCH_KERNELS.get():  # benchmarks compare with the interpreted kernels
        return
    apply()
