"""CPU-engine helpers that SGLang imports from sgl_kernel under SGLANG_USE_CPU_ENGINE=1
(copy_all_layer_kv_cache_cpu, assign_req_to_token_pool_cpu, build_tree_kernel_efficient_cpu,
verify_tree_greedy_cpu, assign_draft_cache_locs_contiguous_cpu, assign_extend_cache_locs_cpu,
fill_accept_out_cache_loc_cpu, fill_bonus_tokens_cpu).

SGLang calls them only when the device is CPU, in place of its Triton kernels of the same name
(kernels/ops/speculative/*.py, kernels/ops/kvcache/cache_move.py, mem_cache/allocation.py); they
are plain torch / Python with the semantics of those kernels. No Triton kernel: CPU only.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch


def _per_req_ranges(start: torch.Tensor, end: torch.Tensor) -> list[tuple[int, int, int]]:
    s, e = start.tolist(), end.tolist()
    out, off = [], 0
    for a, b in zip(s, e, strict=False):
        out.append((a, b, off))
        off += max(b - a, 0)
    return out


def assign_req_to_token_pool(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                             start_offset: torch.Tensor, end_offset: torch.Tensor,
                             out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """req_to_token[req][start:end] = out_cache_loc[consecutive slice] for each request."""
    flat = req_to_token.view(-1)
    for r, (a, b, off) in zip(req_pool_indices.tolist(), _per_req_ranges(start_offset, end_offset), strict=False):
        if b > a:
            flat[r * pool_len + a: r * pool_len + b] = out_cache_loc[off: off + b - a].to(flat.dtype)


def assign_extend_cache_locs(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                             start_offset: torch.Tensor, end_offset: torch.Tensor,
                             out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """out_cache_loc[consecutive slice] = req_to_token[req][start:end] for each request."""
    flat = req_to_token.reshape(-1)
    for r, (a, b, off) in zip(req_pool_indices.tolist(), _per_req_ranges(start_offset, end_offset), strict=False):
        if b > a:
            out_cache_loc[off: off + b - a] = flat[r * pool_len + a: r * pool_len + b].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                       seq_lens: torch.Tensor, out_cache_loc: torch.Tensor, pool_len: int,
                                       topk: int, num_steps: int) -> None:
    """out_cache_loc[i*n:(i+1)*n] = req_to_token[req_i][seq_len_i : seq_len_i + n], n = topk*num_steps."""
    n = topk * num_steps
    flat = req_to_token.reshape(-1)
    for i, (r, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=False)):
        out_cache_loc[i * n:(i + 1) * n] = flat[r * pool_len + s: r * pool_len + s + n].to(out_cache_loc.dtype)


def fill_bonus_tokens(accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor,
                      accept_stride: int) -> None:
    """bonus_tokens[i] = accept_tokens.flat[i*stride + accept_lens[i] - 1] (the last accepted slot)."""
    b = accept_lens.numel()
    if b == 0:
        return
    idx = torch.arange(b, device=accept_lens.device) * accept_stride + accept_lens.long() - 1
    bonus_tokens[:b] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc(accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                              accept_out_cache_loc: torch.Tensor) -> None:
    """Compact: the j-th non-negative accept_index (in order) writes out_cache_loc[that index]."""
    ai = accept_index.reshape(-1)
    src = ai[ai >= 0].long()
    accept_out_cache_loc[: src.numel()] = out_cache_loc[src].to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                            src_loc: torch.Tensor) -> None:
    """For every buffer (raw address, row stride in bytes): row[tgt] = row[src] (gather first, then
    scatter, so overlapping src/tgt behave like the Triton kernel's load-all-then-store)."""
    if tgt_loc.numel() == 0:
        return
    src = src_loc.long().numpy()
    tgt = tgt_loc.long().numpy()
    rows = int(max(src.max(), tgt.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=False):
        buf = np.ctypeslib.as_array((ctypes.c_uint8 * (rows * int(stride))).from_address(int(ptr)))
        view = buf.reshape(rows, int(stride))
        view[tgt] = view[src]


def build_tree_kernel_efficient(parent_list: torch.Tensor, selected_index: torch.Tensor,
                                verified_seq_len: torch.Tensor, tree_mask: torch.Tensor,
                                positions: torch.Tensor, retrieve_index: torch.Tensor,
                                retrieve_next_token: torch.Tensor, retrieve_next_sibling: torch.Tensor,
                                topk: int, depth: int, draft_token_num: int, tree_mask_mode: int) -> None:
    """EAGLE tree construction (modes FULL_MASK=0 and QLEN_ONLY=1), in place.

    selected_index[b, i-1] names draft token i (i >= 1; token 0 is the verified root); its parent is
    the draft token whose selected index equals parent_list[b, selected_index // topk] (or the root
    when that quotient is 0). Fills the retrieve linked lists (next child = last-added child first),
    per-token positions (seq_len + depth) and the ancestor mask.
    """
    if tree_mask_mode not in (0, 1):
        raise NotImplementedError("winport: QLEN_ONLY_BITPACKING tree masks are not implemented on CPU")
    n = draft_token_num
    bsz = verified_seq_len.numel()
    seq = verified_seq_len.tolist()
    sel = selected_index.reshape(bsz, -1).tolist()
    par = parent_list.reshape(bsz, -1).tolist()
    mask = tree_mask.view(-1)
    ri, rn, rs = retrieve_index.view(bsz, n), retrieve_next_token.view(bsz, n), retrieve_next_sibling.view(bsz, n)
    pos = positions.view(bsz, n)
    prefix = 0
    for b in range(bsz):

        def parent_pos(i: int, b: int = b) -> int | None:
            # position (0 = root, p+1 = draft token p+1) of the parent of draft token i (>= 1)
            q = sel[b][i - 1] // topk
            if q == 0:
                return 0
            want = par[b][q]
            for pp in range(n - 1):
                if sel[b][pp] == want:
                    return pp + 1
            return None

        for i in range(n - 1, 0, -1):
            ri[b, i] = b * n + i
            p = parent_pos(i)
            if p is not None:
                nxt = int(rn[b, p])
                rn[b, p] = i
                if nxt != -1:
                    rs[b, i] = nxt
        ri[b, 0] = b * n
        pos[b, 0] = seq[b]
        for t in range(n):
            if tree_mask_mode == 0:
                # The prefix part of each row (seq_len entries before row0) is left to the caller.
                row0 = n * n * b + prefix * n + (seq[b] + n) * t + seq[b]
            else:
                row0 = n * n * b + n * t
            mask[row0: row0 + n] = False
            mask[row0] = True
            if t == 0:
                continue
            cur, d = t, 0
            while cur > 0 and d < depth:
                d += 1
                mask[row0 + cur] = True
                p = parent_pos(cur)
                if p is None:
                    break
                cur = p
            pos[b, t] = seq[b] + d
        prefix += seq[b]


def verify_tree_greedy(predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor,
                       candidates: torch.Tensor, retrive_index: torch.Tensor,
                       retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
                       target_predict: torch.Tensor) -> None:
    """Greedy tree verification, in place: walk from the root, at each level accept the first child
    (in sibling order) whose candidate token equals the target's argmax at the last accepted node."""
    bsz, n = candidates.shape
    n_spec = accept_index.shape[1]
    tp = target_predict.reshape(-1)
    pred = predicts.reshape(-1)
    for b in range(bsz):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        n_acc = 0
        cur = 0
        for _ in range(1, n_spec):
            cur = int(retrive_next_token[b, cur])
            target = int(tp[last])
            matched = False
            while cur != -1:
                if int(candidates[b, cur]) == target:
                    pred[last] = target
                    n_acc += 1
                    last = int(retrive_index[b, cur])
                    accept_index[b, n_acc] = last
                    matched = True
                    break
                cur = int(retrive_next_sibling[b, cur])
            if not matched:
                break
        accept_token_num[b] = n_acc
        pred[last] = tp[last]
