"""Sampling (sgl_kernel top_k_renorm_prob / top_p_renorm_prob, flashinfer.sampling softmax,
top_k/top_p/min_p renorm and sampling from probs or logits).

Filtering follows FlashInfer's semantics: top-k keeps every token whose probability is >= the k-th
largest (ties may keep more than k); top-p keeps the tokens whose ascending cumulative mass is
>= 1 - p; min-p keeps probs >= min_p * max prob; "joint" intersects the top-k and top-p masks of the
original distribution, "top_k_first" applies top-p to the top-k-renormalized distribution.
Sampling draws one uniform per row from the caller's torch.Generator and inverts the CDF of the
filtered distribution, so the same generator state gives the same tokens on the logits and the
probs entry points. FlashInfer's own RNG (Philox inside its kernel) is not reproducible here; tests
check support and distribution, as upstream's do.

Filtering and sampling are torch on every device. The masks below (`top_k_mask`, `top_p_mask`,
`filter_top_k_top_p`) are the reference; top-k/top-p sampling itself (`top_k_top_p_sample`) works on
the candidates in descending order: `torch.topk` when every row's k is small (a full sort of 129280
fp32 per row is what the reference spends its time on: 1.9 ms at batch 64 on the H200), one sort
otherwise (the reference sorts twice and scatters), and samples there without mapping the filtered
distribution back onto the vocabulary. Softmax with a per-row
temperature has a Triton kernel (rows split over all SMs: a statistics pass and a normalizing pass),
used by DSpark's accept step.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_stats_kernel(x_ptr, t_ptr, m_ptr, l_ptr, n_cols, x_stride, chunk, n_splits, temp_scalar,
                          HAS_T: tl.constexpr, BLOCK: tl.constexpr, KEEP_L2: tl.constexpr):
    # Pass 1, one program per (row, split): running max and sum of exp over the split's columns.
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    if HAS_T:
        inv_t = 1.0 / tl.load(t_ptr + row).to(tl.float32)
    else:
        inv_t = 1.0 / temp_scalar
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    lo = split * chunk
    for start in range(0, chunk, BLOCK):
        cols = lo + start + tl.arange(0, BLOCK)
        if KEEP_L2:
            # Ask L2 to keep the logits: pass 2 reads them again right away.
            x = tl.load(x_ptr + row * x_stride + cols, mask=cols < n_cols, other=float("-inf"),
                        eviction_policy="evict_last")
        else:
            x = tl.load(x_ptr + row * x_stride + cols, mask=cols < n_cols, other=float("-inf"))
        x = x.to(tl.float32) * inv_t
        new_m = tl.maximum(m, x)
        # A lane that has only seen -inf keeps acc 0 (exp(-inf - 0)), never exp(nan).
        new_m_safe = tl.where(new_m == float("-inf"), 0.0, new_m)
        acc = acc * tl.exp(m - new_m_safe) + tl.exp(x - new_m_safe)
        m = new_m
    split_m = tl.max(m, axis=0)
    split_m_safe = tl.where(split_m == float("-inf"), 0.0, split_m)
    tl.store(m_ptr + row * n_splits + split, split_m)
    tl.store(l_ptr + row * n_splits + split, tl.sum(acc * tl.exp(m - split_m_safe), axis=0))


@triton.jit
def _softmax_norm_kernel(x_ptr, t_ptr, m_ptr, l_ptr, out_ptr, n_rows, n_cols, x_stride, out_stride, chunk,
                         n_splits, temp_scalar, HAS_T: tl.constexpr, BLOCK: tl.constexpr,
                         SBLOCK: tl.constexpr, KEEP_L2: tl.constexpr):
    # Pass 2, one program per (row, split): combine the row's split statistics, then write
    # exp(x / t - max) / sum over the split. Programs run in the reverse order of pass 1 so the
    # splits read last by pass 1 (the likeliest to still sit in L2) are read again first.
    row = (n_rows - 1 - tl.program_id(0)).to(tl.int64)
    split = n_splits - 1 - tl.program_id(1)
    if HAS_T:
        inv_t = 1.0 / tl.load(t_ptr + row).to(tl.float32)
    else:
        inv_t = 1.0 / temp_scalar
    si = tl.arange(0, SBLOCK)
    sm = si < n_splits
    ms = tl.load(m_ptr + row * n_splits + si, mask=sm, other=float("-inf"))
    ls = tl.load(l_ptr + row * n_splits + si, mask=sm, other=0.0)
    row_m = tl.max(ms, axis=0)
    row_sum = tl.sum(ls * tl.exp(ms - row_m), axis=0)
    inv_sum = 1.0 / row_sum
    lo = split * chunk
    for start in range(0, chunk, BLOCK):
        cols = lo + start + tl.arange(0, BLOCK)
        cm = cols < n_cols
        if KEEP_L2:
            # Last use of the logits, and the output is not read here: both may leave L2 first.
            x = tl.load(x_ptr + row * x_stride + cols, mask=cm, other=float("-inf"), eviction_policy="evict_first")
            tl.store(out_ptr + row * out_stride + cols, tl.exp(x.to(tl.float32) * inv_t - row_m) * inv_sum, mask=cm,
                     eviction_policy="evict_first")
        else:
            x = tl.load(x_ptr + row * x_stride + cols, mask=cm, other=float("-inf"))
            tl.store(out_ptr + row * out_stride + cols, tl.exp(x.to(tl.float32) * inv_t - row_m) * inv_sum, mask=cm)


@functools.cache
def _sm_count(index: int) -> int:
    # Cached: the softmax shim runs per decode step, outside CUDA graphs too.
    return torch.cuda.get_device_properties(index).multi_processor_count


def softmax_config(b: int, v: int, device: torch.device) -> tuple[int, int, int, bool]:
    """Default (splits per row, BLOCK, num_warps, KEEP_L2), from the H200 sweep (scripts/bench/ops.py
    --sweep): split rows so that every SM gets ~16 programs; BLOCK 1024 with 2 warps and the L2
    eviction hints had the best cold-L2 time at 64 x 129280 (32.8 us, 29.4 us warm; every config
    swept was within 29-31 us warm, 33-35 us cold: the two reads of the logits bound it)."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 8
    block = min(1024, triton.next_power_of_2(v))
    return max(1, min(triton.cdiv(16 * sms, b), triton.cdiv(v, block))), block, 2, True


def softmax_triton(logits: torch.Tensor, temperature: torch.Tensor | float | None, out: torch.Tensor,
                   config: tuple[int, int, int, bool] | tuple[int, int, int, bool, int] | None = None) -> None:
    """fp32 softmax(logits / temperature) per row into out.

    Each row is cut into `splits` column ranges (a multiple of BLOCK wide) so that a small batch of
    long rows still spreads over every SM: pass 1 writes (max, sum of exp) per split, pass 2 combines
    them and writes the normalized output (KEEP_L2: L2 eviction hints so that pass 2 finds the logits
    in L2). config = (splits, BLOCK, num_warps, KEEP_L2[, row_groups]) overrides softmax_config
    (benchmarks, tests); row_groups > 1 runs both passes on one group of rows after another, so that
    a group's logits are still in L2 when its pass 2 reads them (2 launches per group)."""
    b, v = logits.shape
    if b == 0:
        return
    if logits.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("softmax_triton: logits and out need unit stride over the vocab")
    if out.shape != logits.shape:
        raise ValueError(f"softmax_triton: out has shape {tuple(out.shape)}, logits {tuple(logits.shape)}")
    has_t = isinstance(temperature, torch.Tensor)
    t_arg = temperature.float().reshape(-1).expand(b).contiguous() if has_t else logits
    scalar = float(temperature) if (temperature is not None and not has_t) else 1.0
    cfg = config or softmax_config(b, v, logits.device)
    splits, block, warps, keep_l2 = cfg[:4]
    groups = max(1, min(cfg[4] if len(cfg) > 4 else 1, b))
    chunk = triton.cdiv(triton.cdiv(v, splits), block) * block
    splits = triton.cdiv(v, chunk)  # no empty split
    m = torch.empty(b, splits, dtype=torch.float32, device=logits.device)
    l_ = torch.empty_like(m)
    per = triton.cdiv(b, groups)
    for r0 in range(0, b, per):
        r1 = min(b, r0 + per)
        xg, og, mg, lg = logits[r0:r1], out[r0:r1], m[r0:r1], l_[r0:r1]
        tg = t_arg[r0:r1] if has_t else xg
        _softmax_stats_kernel[(r1 - r0, splits)](xg, tg, mg, lg, v, logits.stride(0), chunk, splits, scalar,
                                                 HAS_T=has_t, BLOCK=block, KEEP_L2=bool(keep_l2), num_warps=warps)
        _softmax_norm_kernel[(r1 - r0, splits)](xg, tg, mg, lg, og, r1 - r0, v, logits.stride(0), out.stride(0),
                                                chunk, splits, scalar, HAS_T=has_t, BLOCK=block,
                                                SBLOCK=triton.next_power_of_2(splits), KEEP_L2=bool(keep_l2),
                                                num_warps=warps)


def softmax_ref(logits: torch.Tensor, temperature: torch.Tensor | float | None) -> torch.Tensor:
    """torch reference."""
    x = logits.float()
    if isinstance(temperature, torch.Tensor):
        x = x / temperature.float().view(-1, 1)
    elif temperature is not None:
        x = x / float(temperature)
    return torch.softmax(x, dim=-1)


def _per_row(val: torch.Tensor | float | int, b: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(val, torch.Tensor):
        return val.to(device=device, dtype=dtype).reshape(-1).expand(b) if val.numel() == 1 else \
            val.to(device=device, dtype=dtype).reshape(b)
    return torch.full((b,), val, device=device, dtype=dtype)


def top_k_mask(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """bool [B, V]: prob >= the k-th largest prob of its row (k <= 0 or k >= V keeps all)."""
    b, v = probs.shape
    k = _per_row(top_k, b, probs.device, torch.int64)
    keep_all = (k <= 0) | (k >= v)
    srt = probs.sort(dim=-1, descending=True).values
    pivot = srt.gather(1, (k.clamp(1, v) - 1).view(-1, 1))
    return (probs >= pivot) | keep_all.view(-1, 1)


def top_p_mask(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """bool [B, V]: ascending cumulative mass >= 1 - p."""
    b, _ = probs.shape
    p = _per_row(top_p, b, probs.device, torch.float32)
    srt, idx = probs.sort(dim=-1, descending=False)
    cdf = srt.cumsum(dim=-1)
    keep_sorted = cdf >= (1.0 - p).view(-1, 1)
    return torch.zeros_like(keep_sorted).scatter_(1, idx, keep_sorted)


def min_p_mask(probs: torch.Tensor, min_p: torch.Tensor | float) -> torch.Tensor:
    """bool [B, V]: prob >= min_p * row max."""
    b, _ = probs.shape
    p = _per_row(min_p, b, probs.device, torch.float32)
    return probs >= p.view(-1, 1) * probs.amax(dim=-1, keepdim=True)


def renorm(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Zero the dropped tokens and renormalize each row (fp32)."""
    q = torch.where(keep, probs.float(), torch.zeros((), device=probs.device))
    return q / q.sum(dim=-1, keepdim=True)


def sample_from(q: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Inverse-CDF sampling of each row of a non-negative (unnormalized) distribution -> int32 ids."""
    b, v = q.shape
    if b == 0:
        return torch.empty(0, dtype=torch.int32, device=q.device)
    u = torch.rand(b, generator=generator, device=q.device, dtype=torch.float32)
    cdf = q.float().cumsum(dim=-1)
    target = (u * cdf[:, -1]).view(-1, 1)
    idx = torch.searchsorted(cdf.contiguous(), target.contiguous(), right=True).view(-1)
    return idx.clamp_(0, v - 1).to(torch.int32)


def filter_top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor | int, top_p: torch.Tensor | float,
                       order: str) -> torch.Tensor:
    """Filtered, unnormalized fp32 distribution for top_k_top_p sampling."""
    probs = probs.float()
    if order == "top_k_first":
        rk = renorm(probs, top_k_mask(probs, top_k))
        return torch.where(top_p_mask(rk, top_p), rk, torch.zeros((), device=probs.device))
    if order == "joint":
        keep = top_k_mask(probs, top_k) & top_p_mask(probs, top_p)
        return torch.where(keep, probs, torch.zeros((), device=probs.device))
    raise ValueError(f"Invalid filter_apply_order: {order}")


TOPK_CANDIDATES_MAX = 1024  # rows all asking for top-k <= this take torch.topk instead of a full sort
# Per device type, batches smaller than this sort without reading k back. On CUDA the topk route's
# two host reads (each a stream sync) cost more than they save when there are few rows to sort. H200,
# eager, k=50 p=0.9 (scripts/bench/ops.py, RESULTS.md 2026-11-30): topk route vs sort route 630 vs
# 517 us at batch 1, 686 vs 524 at 4, 609 vs 673 at 16, 1090 vs 1262 at 64. On the CPU a host read
# costs nothing, so every batch takes the topk route (device types not listed: 1 row).
TOPK_CANDIDATES_MIN_ROWS: dict[str, int] = {"cuda": 16}


def _rows_bounded_by_k(probs: torch.Tensor, k: torch.Tensor) -> int:
    """How many candidates per row `torch.topk` returns (twice the largest k plus 16: room for ties),
    or 0 when a full sort is needed: a row keeps all (k <= 0 or k >= V), k exceeds
    TOPK_CANDIDATES_MAX, the batch is under its device's TOPK_CANDIDATES_MIN_ROWS, or a CUDA graph is
    being captured (these checks read values back to the host)."""
    b, v = probs.shape
    if b < max(1, TOPK_CANDIDATES_MIN_ROWS.get(probs.device.type, 1)) or (
            probs.is_cuda and torch.cuda.is_current_stream_capturing()):
        return 0
    kmax, kmin = (int(x) for x in torch.stack([k.max(), k.min()]).tolist())
    if kmin <= 0 or kmax >= v or kmax > TOPK_CANDIDATES_MAX:
        return 0
    # Headroom for ties with the k-th value: bf16 logits repeat values, so the k-th is often tied.
    c = 2 * kmax + 16
    return c if c < v else 0


def _descending_candidates(probs: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(values, vocabulary ids) of each row's candidates in descending order, and whether they are the
    whole row."""
    c = _rows_bounded_by_k(probs, k)
    if c:
        vals, idx = probs.topk(c, dim=-1, sorted=True)
        pivot = vals.gather(1, (k - 1).view(-1, 1))
        # Every token >= its row's pivot must be a candidate; more of them than c means ties ran past.
        if int((probs >= pivot).sum(-1).max()) <= c:
            return vals, idx, False
    vals, idx = probs.sort(dim=-1, descending=True)
    return vals, idx, True


def _ascending_mass_from(vals: torch.Tensor, below: torch.Tensor | None) -> torch.Tensor:
    """Per candidate (descending order), the mass of every token of the row at or below it: the
    reference's ascending cumulative sum, summed in the same order (smallest first); `below` is the
    mass of the tokens that are not candidates (added first, as they are the smallest)."""
    mass = vals.flip(-1).cumsum(-1).flip(-1)
    return mass if below is None else mass + below.view(-1, 1)


def top_k_top_p_candidates(probs: torch.Tensor, top_k: torch.Tensor | int, top_p: torch.Tensor | float,
                           order: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The filtered distribution of `filter_top_k_top_p` (same masks, same tie rule) on each row's
    candidates in descending order: (unnormalized fp32 values, int64 vocabulary ids), zeros where
    filtered out. Tokens that are not candidates are filtered out.

    One deliberate difference: the row's most probable token is always kept. The reference's top-p
    mask can keep nothing when rounding leaves the renormalized mass a hair under 1 - p (p near 0);
    FlashInfer never returns an empty support either."""
    if order not in ("top_k_first", "joint"):
        raise ValueError(f"Invalid filter_apply_order: {order}")
    probs = probs.float()
    b, v = probs.shape
    k = _per_row(top_k, b, probs.device, torch.int64)
    p = _per_row(top_p, b, probs.device, torch.float32)
    vals, idx, whole = _descending_candidates(probs, k)
    keep_all = ((k <= 0) | (k >= v)).view(-1, 1)
    pivot = vals.gather(1, (k.clamp(1, vals.shape[1]) - 1).view(-1, 1))
    keep = (vals >= pivot) | keep_all
    if order == "top_k_first":
        kept = torch.where(keep, vals, torch.zeros((), device=vals.device))
        q = kept / kept.sum(-1, keepdim=True)
        keep = keep & (_ascending_mass_from(q, None) >= (1.0 - p).view(-1, 1))
    else:
        below = None if whole else (probs.sum(-1) - vals.sum(-1)).clamp_min(0.0)
        keep = keep & (_ascending_mass_from(vals, below) >= (1.0 - p).view(-1, 1))
        q = vals
    keep[:, 0] = True
    return torch.where(keep, q, torch.zeros((), device=q.device)), idx


def top_k_top_p_sample(probs: torch.Tensor, top_k: torch.Tensor | int, top_p: torch.Tensor | float, order: str,
                       generator: torch.Generator | None) -> torch.Tensor:
    """Top-k/top-p sampling -> int32 ids: one uniform per row (as `sample_from`) inverts the CDF of
    `top_k_top_p_candidates`' distribution."""
    q, idx = top_k_top_p_candidates(probs, top_k, top_p, order)
    b = q.shape[0]
    if b == 0:
        return torch.empty(0, dtype=torch.int32, device=probs.device)
    u = torch.rand(b, generator=generator, device=probs.device, dtype=torch.float32)
    cdf = q.cumsum(-1)
    pos = torch.searchsorted(cdf.contiguous(), (u * cdf[:, -1]).view(-1, 1).contiguous(), right=True)
    return idx.gather(1, pos.clamp_(0, q.shape[1] - 1)).view(-1).to(torch.int32)
