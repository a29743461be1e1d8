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
    """Write sorted_token_ids, experts_ids, num_tokens_post_pad (and cumsum_buffer) in place.

    Fixed shapes and no host synchronisation (SGLang calls it inside captured CUDA graphs):
    dropped slots sort last and land in a scratch slot past the end of a working copy, and the
    padded total stays a device tensor.
    """
    flat = topk_ids.reshape(-1).to(torch.int64)
    numel = flat.numel()
    dev = flat.device
    bucket = flat + 1
    in_range = (flat >= 0) & (flat < num_experts - 1)
    if ignore_invalid_expert:
        bucket = torch.where(in_range, bucket, torch.full_like(bucket, -1))
    else:
        bucket = torch.where(in_range, bucket, torch.zeros_like(bucket))
    kept = bucket >= 0
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, bucket.clamp(min=0), kept.to(torch.int64))
    padded = (counts + block_size - 1) // block_size * block_size
    cums = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
    cums[1:] = torch.cumsum(padded, 0)
    total = cums[-1]
    cap = sorted_token_ids.numel()
    work = torch.empty(cap + 1, dtype=sorted_token_ids.dtype, device=dev)
    work[:cap] = sorted_token_ids
    if pad_sorted_token_ids:
        slot = torch.arange(cap, device=dev)
        work[:cap] = torch.where(slot < total, torch.full_like(work[:cap], numel), work[:cap])
    key = torch.where(kept, bucket, torch.full_like(bucket, num_experts))
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    starts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
    starts[1:] = torch.cumsum(counts, 0)
    valid = sorted_key < num_experts
    b = sorted_key.clamp(max=num_experts - 1)
    rank = torch.arange(numel, device=dev) - starts[b]
    dst = torch.where(valid, cums[b] + rank, torch.full_like(rank, cap))
    work[dst] = order.to(work.dtype)
    sorted_token_ids.copy_(work[:cap])
    block = torch.arange(experts_ids.numel(), device=dev)
    block_bucket = torch.searchsorted(cums // block_size, block, right=True) - 1
    experts_ids.copy_(torch.where(block < total // block_size, (block_bucket - 1).to(experts_ids.dtype), experts_ids))
    num_tokens_post_pad.copy_(total.expand(num_tokens_post_pad.shape))
    if cumsum_buffer is not None:
        cumsum_buffer[: num_experts + 1] = cums.to(cumsum_buffer.dtype)
