"""moe_align_block_size (sgl_kernel): group the flattened (token, slot) indices by expert, each
expert's run padded to a multiple of block_size, plus the expert id of every block.

Plain torch on every device: it is a histogram, a cumsum and one stable sort of topk_ids.numel()
int32 values (a few thousand at prefill), a handful of small launches that cost far less than the
MoE GEMMs they feed; a Triton port would not change the step time.

Convention (the fused-MoE callers pass num_experts = real experts + 1): expert id e goes to bucket
e + 1 and bucket 0 collects invalid ids (-1, EP-masked slots); a block's expert id is bucket - 1,
so invalid blocks read -1. With ignore_invalid_expert, invalid slots are dropped instead.
"""

from __future__ import annotations

import torch


def moe_align_block_size_ref(topk_ids: torch.Tensor, num_experts: int, block_size: int,
                             sorted_token_ids: torch.Tensor, experts_ids: torch.Tensor,
                             num_tokens_post_pad: torch.Tensor, cumsum_buffer: torch.Tensor | None,
                             pad_sorted_token_ids: bool = False, ignore_invalid_expert: bool = False) -> None:
    """Write sorted_token_ids, experts_ids, num_tokens_post_pad (and cumsum_buffer) in place."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    numel = flat.numel()
    dev = flat.device
    bucket = flat + 1
    keep = (flat >= 0) & (flat < num_experts - 1)
    if ignore_invalid_expert:
        bucket = torch.where(keep, bucket, torch.full_like(bucket, -1))
    else:
        bucket = torch.where(keep, bucket, torch.zeros_like(bucket))
    counts = torch.bincount(bucket[bucket >= 0], minlength=num_experts)[:num_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    cums = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
    cums[1:] = torch.cumsum(padded, 0)
    total = int(cums[-1])
    if pad_sorted_token_ids:
        sorted_token_ids[:total].fill_(numel)
    valid_pos = torch.nonzero(bucket >= 0).reshape(-1)
    vb = bucket[valid_pos]
    order = torch.argsort(vb, stable=True)
    sorted_b = vb[order]
    starts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
    starts[1:] = torch.cumsum(counts, 0)
    rank = torch.arange(sorted_b.numel(), device=dev) - starts[sorted_b]
    dst = cums[sorted_b] + rank
    sorted_token_ids[dst] = valid_pos[order].to(sorted_token_ids.dtype)
    n_blocks = total // block_size
    block_bucket = torch.repeat_interleave(torch.arange(num_experts, device=dev), padded // block_size)
    experts_ids[:n_blocks] = (block_bucket - 1).to(experts_ids.dtype)
    num_tokens_post_pad.fill_(total)
    if cumsum_buffer is not None:
        cumsum_buffer[: num_experts + 1] = cums.to(cumsum_buffer.dtype)
